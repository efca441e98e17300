"""A TrainJob's progress in its own status, where the cluster offers it (docs/kubernetes.md, "Progress
in the TrainJob's status").

Kubeflow Trainer's `TrainJobStatus` feature (its Progress plugin, kubeflow/trainer #3227, KEP-2779)
gives a TrainJob's pods three variables: KUBEFLOW_TRAINER_STATUS_URL (its status server's HTTPS
endpoint for this job), KUBEFLOW_TRAINER_STATUS_CA_CERT (the path of the CA that signs it) and
KUBEFLOW_TRAINER_STATUS_TOKEN (the path of a projected service-account token). A POST of
`{"trainerStatus": {"progressPercentage", "estimatedRemainingSeconds", "metrics": [{"name",
"value"}], "lastUpdatedTime"}}` sets the TrainJob's `status.trainerStatus`, which
`kubectl get trainjob` shows. The first pod's bootstrap reports what rank 0's progress.json says
(launcher.wire.metric_lines: step, loss, tokens/s, ETA) every REPORT_S while it changes: no
hyperparameter, no environment value, no secret is ever in it; the token goes in the header only.
A server that refuses is said once in the log, and the job goes on: the status is a display.
"""

from __future__ import annotations

import json
import ssl
import threading
import urllib.request
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from launcher.wire.metric_lines import Progress, read_progress

URL_ENV = "KUBEFLOW_TRAINER_STATUS_URL"
CA_ENV, TOKEN_ENV = "KUBEFLOW_TRAINER_STATUS_CA_CERT", "KUBEFLOW_TRAINER_STATUS_TOKEN"
REPORT_S = 30.0
TIMEOUT_S = 10.0


def payload(progress: Progress) -> dict:
    """The status server's body for `progress` (its metrics' values are strings, as the API has them)."""
    metrics = {"step": progress.step, "loss": progress.loss, "tokens_per_s": progress.tokens_per_s}
    status = {"progressPercentage": min(100, 100 * progress.step // progress.max_steps),
              "metrics": [{"name": k, "value": f"{v:g}" if isinstance(v, float) else str(v)}
                          for k, v in metrics.items() if v is not None],
              "lastUpdatedTime": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    if progress.eta_s is not None:
        status["estimatedRemainingSeconds"] = round(progress.eta_s)
    return {"trainerStatus": status}


def sender(environ: dict[str, str]) -> Callable[[dict], None] | None:
    """A POST of a body to the job's status server; None where the cluster offers none."""
    url = environ.get(URL_ENV)
    if not url:
        return None
    context = ssl.create_default_context(cafile=environ.get(CA_ENV) or None)
    token_file = environ.get(TOKEN_ENV)

    def send(body: dict) -> None:
        headers = {"Content-Type": "application/json"}
        if token_file:  # read each time: the projected token is rotated
            headers["Authorization"] = f"Bearer {Path(token_file).read_text(encoding='utf-8').strip()}"
        request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
        with urllib.request.urlopen(request, timeout=TIMEOUT_S, context=context if url.startswith("https") else None):
            pass
    return send


class StatusReporter:
    """`with StatusReporter(output_data, send, log):` reports while the block runs, and once at its end."""

    def __init__(self, output_data: Path, send: Callable[[dict], None], log: Callable[[str], None],
                 interval: float = REPORT_S):
        self.output_data, self.send, self.log, self.interval = output_data, send, log, interval
        self._last: Progress | None = None
        self._failed = False
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def report(self) -> None:
        progress = read_progress(self.output_data)
        if progress is None or progress == self._last:
            return
        try:
            self.send(payload(progress))
            self._last = progress
        except Exception as exc:  # noqa: BLE001 - a display: the job goes on without it
            if not self._failed:
                self.log(f"the TrainJob's status server refused a progress report ({type(exc).__name__}: {exc}); "
                         "training goes on, kubectl get trainjob shows no progress")
            self._failed = True

    def _run(self) -> None:
        while not self._stopping.wait(self.interval):
            self.report()

    def __enter__(self) -> StatusReporter:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stopping.set()
        self._thread.join()
        self.report()
