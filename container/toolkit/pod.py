"""`python -m container pod`: a Kubernetes pod of a smlaunch TrainJob becomes one SageMaker host.

Kubeflow Trainer's torch runtime starts the same command in every pod of the TrainJob's JobSet and
tells each which node it is; in a HyperPodPyTorchJob, HyperPod's elastic agent (hyperpodrun) starts
it as its one worker and tells it the same (launcher.wire.pod_config). This entry writes that host's
/opt/ml tree (launcher.wire.opt_ml.write_opt_ml, as the local runners write each simulated host's)
from the ConfigMap the client rendered: on the job's claim, `<job_dir>/hosts/<host>`; on S3 storage
on the pod's own disk, its channels and the job's checkpoints downloaded first and its checkpoints,
records and outputs mirrored to S3 (container.toolkit.pod_storage). It then runs the bootstrap
in this process, as `python -m container train` does: hosts, current host, hyperparameters,
channels and the shared checkpoint directory are the ones SageMaker, local mode and Slurm give.
torchrun meets at the launcher's master (the first pod, through the JobSet's headless service; the
rank-0 pod the HyperPod operator names).
"""

# Imports inside functions: the bootstrap (and the catalog it imports) loads after the tree is written.
from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

from container.toolkit.console import log
from container.toolkit.pod_storage import Mirror, Syncing, download_inputs, finish
from container.toolkit.trainer_status import StatusReporter, sender
from launcher.wire import pod_config
from launcher.wire.opt_ml import write_opt_ml


def prepare_host(env: dict[str, str]) -> tuple[Path, dict[str, str], Mirror | None]:
    """Write this pod's /opt/ml tree; (its base directory, the variables the bootstrap then needs,
    the S3 mirror of its checkpoints and records on S3 storage, else None)."""
    place = pod_config.pod_place(env)
    hosts, host = place.hosts, place.host
    config_dir = Path(env.get(pod_config.CONFIG_DIR_ENV, pod_config.CONFIG_DIR))
    config = json.loads((config_dir / pod_config.CONFIG_FILE).read_text(encoding="utf-8"))
    hyperparameters = dict(config["hyperparameters"])
    hyperparameters.update(json.loads(env.get(pod_config.SECRET_HYPERPARAMETERS_ENV) or "{}"))
    hyperparameters["sagemaker_submit_directory"] = json.dumps(str(config_dir / pod_config.SOURCE_ARCHIVE))
    channels = {name: Path(path) for name, path in config["channels"].items()}
    mirror = None
    if "s3" in config:  # the pod's own disk, mirrored to the job's S3 prefixes (container.toolkit.pod_storage)
        scratch = Path(env.get(pod_config.SCRATCH_DIR_ENV, pod_config.SCRATCH_DIR))
        base, checkpoint_dir = scratch / "hosts" / host, scratch / "checkpoints"
        channels = download_inputs(config["s3"], config["channels"], config["distributions"], hosts, host,
                                   scratch, checkpoint_dir)
        mirror = Mirror(host, base, checkpoint_dir, config["s3"])
        mirror.note_present()
    else:  # on the claim every pod mounts
        base, checkpoint_dir = Path(config["job_dir"]) / "hosts" / host, Path(config["checkpoint_dir"])
    write_opt_ml(base, hyperparameters=hyperparameters, current_host=host, hosts=hosts,
                 instance_type=config["instance_type"], input_mode=config["input_mode"],
                 channels=channels, distributions=config["distributions"])
    variables = {"SAGEMAKER_BASE_DIR": str(base), "SMLAUNCH_CHECKPOINT_DIR": str(checkpoint_dir)}
    if len(hosts) > 1:  # torchrun's static rendezvous at the launcher's master, not at "algo-1"
        if not (place.master_addr and place.master_port):
            raise pod_config.PodEnvError("the pod's launcher named no master address and port for a job of "
                                         f"{len(hosts)} pods")
        variables["SMLAUNCH_MASTER_ADDR"], variables["SMLAUNCH_MASTER_PORT"] = place.master_addr, place.master_port
    return base, variables, mirror


def main() -> int:
    try:
        base, variables, mirror = prepare_host(dict(os.environ))
    except (pod_config.PodEnvError, OSError, KeyError, ValueError, LookupError) as exc:
        print(f"[smlaunch] this pod cannot become a host of the job: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    os.environ.pop(pod_config.SECRET_HYPERPARAMETERS_ENV, None)  # in hyperparameters.json now, as on SageMaker
    hosts = pod_config.pod_hosts(os.environ)[0]  # read before hyperpodrun's variables go
    for name in pod_config.launcher_variables(os.environ):  # hyperpodrun's, for its worker: read above
        del os.environ[name]
    os.environ.update(variables)
    from container.toolkit.bootstrap import train  # after the tree: it imports the catalog

    send = sender(dict(os.environ))  # Kubeflow Trainer's TrainJobStatus, where it is on
    # only the first pod's output holds rank 0's progress: the others find nothing to report
    reporting = StatusReporter(base / "output" / "data", send, log) if send else contextlib.nullcontext()
    if mirror is None:
        with reporting:
            return train(base)
    with Syncing(mirror), reporting:
        code = train(base)
    try:
        finish(mirror, hosts, trained=code == 0)
    except Exception as exc:  # S3 refused the last upload: the job's checkpoints or outputs are not stored
        print(f"[smlaunch] storing the job's files in S3 failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return code or 1
    return code
