"""Progress in a TrainJob's own status (container/toolkit/trainer_status.py): the body Kubeflow
Trainer's status server takes (kubeflow/trainer #3227's e2e script sends the same shape), sent as
rank 0's progress changes, with the projected token in the header and nothing else of the job."""

from __future__ import annotations

import json

from container.toolkit import trainer_status
from container.toolkit.trainer_status import StatusReporter, payload, sender
from launcher.wire.metric_lines import Progress, write_progress


def test_the_body_is_the_status_servers_shape_with_the_progress_only():
    body = payload(Progress(step=30, max_steps=120, loss=2.25, tokens_per_s=9000.0, eta_s=271.6))["trainerStatus"]
    assert body["progressPercentage"] == 25 and body["estimatedRemainingSeconds"] == 272
    assert body["metrics"] == [{"name": "step", "value": "30"}, {"name": "loss", "value": "2.25"},
                               {"name": "tokens_per_s", "value": "9000"}]
    assert set(body) == {"progressPercentage", "estimatedRemainingSeconds", "metrics", "lastUpdatedTime"}
    assert "estimatedRemainingSeconds" not in payload(Progress(step=1, max_steps=2))["trainerStatus"]  # none known


def test_the_reporter_sends_what_changed_and_a_refusal_is_said_once(tmp_path):
    sent, said = [], []
    reporter = StatusReporter(tmp_path, sent.append, said.append)
    reporter.report()
    assert sent == []  # the control: no progress yet (or another pod's output: never any)
    write_progress(tmp_path, Progress(step=5, max_steps=10, loss=3.0))
    reporter.report()
    reporter.report()  # unchanged: not sent again
    assert [b["trainerStatus"]["progressPercentage"] for b in sent] == [50]
    write_progress(tmp_path, Progress(step=10, max_steps=10, loss=2.0))

    def refuse(body):
        raise OSError("503 Service Unavailable")

    reporter.send = refuse
    reporter.report()
    reporter.report()
    assert len(said) == 1 and "refused a progress report" in said[0] and "training goes on" in said[0]


def test_the_request_carries_the_projected_token_in_its_header_and_nothing_without_the_feature(tmp_path, monkeypatch):
    (tmp_path / "token").write_text("eyJhbGciOi.fake.token\n")
    requests = []

    class Answer:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(trainer_status.urllib.request, "urlopen",
                        lambda request, timeout, context: requests.append(request) or Answer())
    url = "http://status.kubeflow-system:10443/apis/trainer.kubeflow.org/v1alpha1/namespaces/ml/trainjobs/k-1/status"
    send = sender({trainer_status.URL_ENV: url, trainer_status.TOKEN_ENV: str(tmp_path / "token")})
    send(payload(Progress(step=1, max_steps=4)))
    (request,) = requests
    assert (request.full_url, request.get_method()) == (url, "POST")
    assert request.get_header("Authorization") == "Bearer eyJhbGciOi.fake.token"
    assert json.loads(request.data)["trainerStatus"]["progressPercentage"] == 25
    assert sender({}) is None  # the control: a cluster without TrainJobStatus gets nothing
