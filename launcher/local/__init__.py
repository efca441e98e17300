"""Local mode: the job's SageMaker contract, bootstrap and script on this machine.

`prepare` turns a validated job into a job directory (code archive, channels, one `/opt/ml`
tree per simulated host); a runner (`process`: one bootstrap per host on 127.0.0.1, or
`docker`: one container per host through compose) runs it; `supervise` follows the hosts,
merges their logs, enforces `max_run`, packs the artifacts and records the outcome in the
job's `job.json`, which `smlaunch status/logs/list` read. Pure stdlib plus boto3 (lazily, for
`s3://` inputs and outputs): no torch.
"""
