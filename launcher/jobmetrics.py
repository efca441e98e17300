"""`from launcher.jobmetrics import job_metrics`, as the walkthrough notebook has long written it: a
job's metrics by handle live in launcher.backends.jobmetrics; this name stays for users' code."""

from launcher.backends.jobmetrics import JobMetrics, NoMetricsError, job_metrics

__all__ = ["JobMetrics", "NoMetricsError", "job_metrics"]
