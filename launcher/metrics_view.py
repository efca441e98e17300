"""`from launcher.metrics_view import plot`, as the walkthrough notebook has long written it: the
table and the picture of jobs' metrics live in launcher.cli.metrics_view; this name stays for users'
code."""

from launcher.cli.metrics_view import plot, table

__all__ = ["plot", "table"]
