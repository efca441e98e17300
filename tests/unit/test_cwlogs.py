import time

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws

from launcher.backends.cwlogs import LOG_GROUP, LogEvent, LogTailer, host_of

JOB = "llama-cp8"
EPOCH = "1700000000"


@pytest.fixture
def logs(monkeypatch: pytest.MonkeyPatch):
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    with mock_aws():
        client = boto3.client("logs", region_name="us-east-1")
        client.create_log_group(logGroupName=LOG_GROUP)
        yield client


def now_ms() -> int:
    return int(time.time() * 1000)


def put(client, stream: str, events: list[tuple[int, str]]) -> None:
    existing = client.describe_log_streams(logGroupName=LOG_GROUP, logStreamNamePrefix=stream)
    if not any(s["logStreamName"] == stream for s in existing["logStreams"]):
        client.create_log_stream(logGroupName=LOG_GROUP, logStreamName=stream)
    client.put_log_events(
        logGroupName=LOG_GROUP,
        logStreamName=stream,
        logEvents=[{"timestamp": ts, "message": msg} for ts, msg in events],
    )


def stream(host: int, job: str = JOB) -> str:
    return f"{job}/algo-{host}-{EPOCH}"


def test_host_of() -> None:
    assert host_of("job/algo-3-1700000000") == "algo-3"
    assert host_of("job/algo-12-1700000000") == "algo-12"
    assert host_of("job/algo-1") == "algo-1"  # no epoch suffix: left alone


def test_merges_hosts_by_time_and_ignores_other_jobs(logs) -> None:
    t = now_ms() - 60_000
    put(logs, stream(1), [(t + 0, "a1"), (t + 30, "a2"), (t + 50, "a3")])
    put(logs, stream(2), [(t + 10, "b1"), (t + 30, "b2")])
    put(logs, stream(3), [(t + 20, "c1")])
    put(logs, stream(1, job=f"{JOB}-2"), [(t + 5, "other job sharing the name prefix")])
    put(logs, stream(1, job="unrelated"), [(t + 5, "unrelated")])

    tailer = LogTailer(logs, JOB)
    assert tailer.streams == []
    events = tailer.poll()

    assert tailer.streams == [stream(1), stream(2), stream(3)]
    assert [e.message for e in events] == ["a1", "b1", "c1", "a2", "b2", "a3"]
    assert events[0] == LogEvent(timestamp=t, stream=stream(1), host="algo-1", message="a1")
    assert [e.host for e in events] == ["algo-1", "algo-2", "algo-3", "algo-1", "algo-2", "algo-1"]
    # equal timestamps are ordered by stream name
    assert [e.stream for e in events if e.timestamp == t + 30] == [stream(1), stream(2)]


def test_second_poll_returns_only_new_events(logs) -> None:
    t = now_ms() - 60_000
    put(logs, stream(1), [(t, "old-1")])
    put(logs, stream(2), [(t + 1, "old-2")])
    tailer = LogTailer(logs, JOB)
    assert [e.message for e in tailer.poll()] == ["old-1", "old-2"]
    assert tailer.poll() == []

    put(logs, stream(2), [(t + 10, "new-2")])
    put(logs, stream(1), [(t + 20, "new-1")])
    put(logs, stream(3), [(t + 5, "late host")])  # a host whose stream appears later
    assert [e.message for e in tailer.poll()] == ["late host", "new-2", "new-1"]
    assert tailer.poll() == []


def test_more_than_one_page_of_streams(logs) -> None:
    t = now_ms() - 60_000
    for host in range(1, 61):
        put(logs, stream(host), [(t + host, f"hello from {host}")])
    describe_calls = []
    logs.meta.events.register(
        "before-parameter-build.cloudwatch-logs.DescribeLogStreams",
        lambda params, **_: describe_calls.append(dict(params)),
    )

    events = LogTailer(logs, JOB).poll()

    assert [e.message for e in events] == [f"hello from {h}" for h in range(1, 61)]
    assert {e.host for e in events} == {f"algo-{h}" for h in range(1, 61)}
    assert len(describe_calls) == 2  # moto pages at 50, like CloudWatch
    assert describe_calls[1].get("nextToken")


def test_missing_log_group_yields_nothing(logs) -> None:
    logs.delete_log_group(logGroupName=LOG_GROUP)
    assert LogTailer(logs, JOB).poll() == []


def test_job_without_streams_yields_nothing(logs) -> None:
    assert LogTailer(logs, JOB).poll() == []


@pytest.fixture
def stubbed():
    client = boto3.client(
        "logs", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
    )
    with Stubber(client) as stubber:
        yield client, stubber
        stubber.assert_no_pending_responses()


def event(ts: int, message: str) -> dict:
    return {"timestamp": ts, "message": message, "ingestionTime": ts}


def test_get_log_events_is_read_until_the_token_repeats(stubbed) -> None:
    client, stubber = stubbed
    name = stream(1)
    describe = {"logGroupName": LOG_GROUP, "logStreamNamePrefix": f"{JOB}/"}
    read = {"logGroupName": LOG_GROUP, "logStreamName": name, "startFromHead": True}
    listing = {"logStreams": [{"logStreamName": name}]}
    stubber.add_response("describe_log_streams", listing, describe)
    stubber.add_response(
        "get_log_events",
        {"events": [event(1, "p1")], "nextForwardToken": "f/1", "nextBackwardToken": "b/0"},
        read,
    )
    stubber.add_response(
        "get_log_events",
        {"events": [event(2, "p2")], "nextForwardToken": "f/2", "nextBackwardToken": "b/1"},
        {**read, "nextToken": "f/1"},
    )
    stubber.add_response(
        "get_log_events",
        {"events": [], "nextForwardToken": "f/2", "nextBackwardToken": "b/2"},
        {**read, "nextToken": "f/2"},
    )
    # next poll resumes from the stored token
    stubber.add_response("describe_log_streams", listing, describe)
    stubber.add_response(
        "get_log_events",
        {"events": [event(3, "p3")], "nextForwardToken": "f/3", "nextBackwardToken": "b/3"},
        {**read, "nextToken": "f/2"},
    )
    stubber.add_response(
        "get_log_events",
        {"events": [], "nextForwardToken": "f/3", "nextBackwardToken": "b/3"},
        {**read, "nextToken": "f/3"},
    )

    tailer = LogTailer(client, JOB)
    assert [e.message for e in tailer.poll()] == ["p1", "p2"]
    assert [e.message for e in tailer.poll()] == ["p3"]


def test_describe_pages_follow_next_token(stubbed) -> None:
    client, stubber = stubbed
    describe = {"logGroupName": LOG_GROUP, "logStreamNamePrefix": f"{JOB}/"}
    stubber.add_response(
        "describe_log_streams",
        {"logStreams": [{"logStreamName": stream(1)}], "nextToken": "page-2"},
        describe,
    )
    stubber.add_response(
        "describe_log_streams",
        {"logStreams": [{"logStreamName": stream(2)}]},
        {**describe, "nextToken": "page-2"},
    )
    for host in (1, 2):
        stubber.add_response(
            "get_log_events",
            {"events": [event(host, f"h{host}")],
             "nextForwardToken": "f", "nextBackwardToken": "b"},
        )
        stubber.add_response(
            "get_log_events", {"events": [], "nextForwardToken": "f", "nextBackwardToken": "b"}
        )
    assert [e.host for e in LogTailer(client, JOB).poll()] == ["algo-1", "algo-2"]


def test_stream_deleted_between_listing_and_reading(stubbed) -> None:
    client, stubber = stubbed
    stubber.add_response("describe_log_streams", {"logStreams": [{"logStreamName": stream(1)}]})
    stubber.add_client_error("get_log_events", service_error_code="ResourceNotFoundException")
    assert LogTailer(client, JOB).poll() == []


def test_other_errors_propagate(stubbed) -> None:
    client, stubber = stubbed
    stubber.add_client_error("describe_log_streams", service_error_code="AccessDeniedException")
    with pytest.raises(client.exceptions.ClientError, match="AccessDenied"):
        LogTailer(client, JOB).poll()


