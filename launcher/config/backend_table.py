"""The backends, declared once: each one's name, the class that runs its jobs, the instance types
it runs, its own section of the job file with that section's rules, how its job handles read, and
each rule of the client that differs by backend (a column: what its hosts run, whether its jobs are
SageMaker training jobs, whether smlaunch's sweeps run there, ...). What differs in running a job is
a method of its class (launcher.backends.base.Backend); no caller tests a backend's name
(tests/unit/test_backend_switches.py).

Everything that lists backends derives from `BACKENDS`: the job file's `backend` choices and
sections (`with_backends`), the rules relating them to the job (backend_rules.py), what
`max_restarts` means there (restarts.py), launcher.backends.registry (which imports a backend's
class only when a job names it, so boto3 loads only for SageMaker), the CLI's `--backend`
choices, `smlaunch list`'s backends and the handles `backend:job`. A new backend is one row here
plus its modules (docs/architecture.md, "Where a new thing goes").

The table lives in config/, the layer the job's schema is built in, and names what it points to as
text ("module:name"), loaded when used: config never imports launcher.backends, and the CLI reads
the names without loading pydantic or any backend (start-up time).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class BackendRow:
    name: str  # the job file's `backend`, the CLI's `--backend`, the prefix of a job handle
    engine: str  # "module:Class" of its launcher.backends.base.Backend, imported when a job names it
    instance_types: Literal["ml", "local", "any"]  # SageMaker's ml.* fleet, this machine's (local, local_gpu), or both
    restarts: str  # what `max_restarts` means there (validate says it)
    # what `min_instance_count` means there (validate says it), or why it is refused (shrinks False)
    shrink: str = "min_instance_count is not supported there"
    shrinks: bool = False
    settings: str | None = None  # "module:Class" of its section of the job file, a field named after the backend
    settings_description: str = ""  # that field's description in the job schema
    rules: str | None = None  # "module:function" of its rules (context.Context -> Issues) for a job that runs there
    # "module:function" (its section or None, the instance type's GPUs) -> GPUs per host, where its section may
    # say otherwise (slurm.gpus_per_node: a node that is not an instance of the catalog)
    host_gpus: str | None = None
    job_ids: bool = False  # a handle may name a job by the engine's own number (slurm:1234)
    in_job_store: bool = True  # its jobs have records in smlaunch's job store (launcher.local.store), not remote
    # every host runs image_uri on the cluster's own storage: the job's paths are not on this machine (its
    # rules check them) and its script's imports are the image's, not this machine's Python
    cluster_image: bool = False
    # "module:function" (the validated job) -> what its hosts run, as validate's summary says it; None: the image of
    # AWS's catalog for the job's instance type
    image: str | None = None
    # "module:function" (the JobConfig) -> (kind, label) of the Python a script of the user's own runs in there
    # (script_rules.Target); None: an image of AWS's catalog, or image_uri
    target: str | None = None
    # SageMaker runs the job, so the settings only SageMaker carries out take effect there (VPC, KMS keys,
    # spot, Debugger, ...: aws_rules.AWS_ONLY); elsewhere validate says each one is left out
    aws_settings: bool = False
    # its jobs are SageMaker training jobs (CreateTrainingJob; JobConfig.on_sagemaker): S3 channels and outputs, an
    # image of AWS's catalog whose toolkit runs the code (and smlaunch's restart loop), the SageMaker SDK's rules,
    # warm pools, and sweeps as SageMaker tuning jobs; the others' jobs read this machine's or the cluster's paths
    sagemaker_jobs: bool = False
    sweeps: bool = False  # smlaunch's sweep controller (launcher.tune, `smlaunch tune`) runs the trials as its jobs

    def runs(self, local: bool) -> bool:
        """Whether it runs a job of this machine's instance types (`local`: local, local_gpu) or of ml.* ones."""
        return self.instance_types in ("any", "local" if local else "ml")

    @property
    def on_this_machine(self) -> bool:
        """Its jobs run on this machine's own devices, and nowhere else."""
        return self.instance_types == "local"


BACKENDS = (
    BackendRow(
        "sagemaker", "launcher.backends.sagemaker:SageMakerBackend", "ml", in_job_store=False, aws_settings=True,
        sagemaker_jobs=True,
        shrink="a SageMaker training job's instance count is fixed: a lost instance fails the job (a resubmission "
               "with fewer instances and the same checkpoint_s3_uri resumes exactly, docs/spot.md)",
        restarts="the image's toolkit runs smlaunch's restart loop (shipped in the code, _smlaunch/restart_loop.py) "
                 "in place of torchrun on each instance, and the loop restarts torchrun on every instance together "
                 "after a fault (a failed, killed, hung or frozen rank); each restart resumes from the newest "
                 "verified checkpoint. A lost instance is SageMaker's: the job fails (max_retry_attempts retries "
                 "only SageMaker's internal errors), and a resubmission with the same checkpoint_s3_uri resumes"),
    BackendRow(
        "local", "launcher.backends.local:LocalBackend", "local", sweeps=True,
        image="launcher.local.docker:image_text", target="launcher.config.backends.local:target",
        shrinks=True, shrink="locally only a simulated host made so by fault injection host-gone",
        restarts="the bootstrap of each simulated host restarts torchrun on every host together after a fault "
                 "(a failed, killed, hung or frozen rank); the supervisor restarts a host whose processes were "
                 "killed; each restart resumes from the newest verified checkpoint"),
    BackendRow(
        "slurm", "launcher.backends.slurm:SlurmBackend", "any", job_ids=True, sweeps=True,
        settings="launcher.config.backends.slurm:SlurmSettings",
        settings_description="backend: slurm: partition, account, time, ...",
        rules="launcher.config.backends.slurm:check_slurm", host_gpus="launcher.config.backends.slurm:node_gpus",
        image="launcher.config.backends.slurm:image_text", target="launcher.config.backends.slurm:target",
        shrinks=True, shrink="a node that left the allocation with no spare node left (slurm.spare_nodes)",
        restarts="the bootstrap on each node restarts torchrun on every node together after a fault (a failed, "
                 "killed, hung or frozen rank), inside the allocation; the supervisor starts every node's step "
                 "again when a node's processes are lost, that node's host on a spare node where slurm.spare_nodes "
                 "gives one; each restart resumes from the newest verified checkpoint"),
    BackendRow(
        "kubernetes", "launcher.backends.kubernetes:KubernetesBackend", "any", cluster_image=True,
        settings="launcher.config.backends.kubernetes:KubernetesSettings",
        settings_description="backend: kubernetes: namespace, Kueue queue, storage claim, ... (docs/kubernetes.md)",
        rules="launcher.config.backends.kubernetes:check_kubernetes",
        image="launcher.config.backends.kubernetes:image_text", target="launcher.config.backends.kubernetes:target",
        shrink="not yet on Kubernetes: a lost pod or node is the JobSet's or the operator's (docs/kubernetes.md)",
        restarts="the bootstrap in each pod restarts torchrun on every pod together after a fault (a failed, "
                 "killed, hung or frozen rank); a lost pod or node is not smlaunch's: a TrainJob's JobSet's "
                 "(its failure policy), and ends a HyperPodPyTorchJob, whose operator's retries smlaunch turns "
                 "off (runPolicy.jobMaxRetryCount 0) so as not to restart the restarts; each restart resumes from "
                 "the newest verified checkpoint"),
)


# Functions, not constants: they read the table when called, so a test that adds a row sees it everywhere.
def names() -> tuple[str, ...]:
    return tuple(b.name for b in BACKENDS)


def named(name: str) -> BackendRow | None:
    return next((b for b in BACKENDS if b.name == name), None)


def default_for(local: bool) -> BackendRow:
    """The backend of a job that names none: the one that runs its kind of instance type only (a local
    instance type: this machine's backend; an ml.* one: SageMaker's)."""
    return next(b for b in BACKENDS if b.instance_types == ("local" if local else "ml"))


def with_sections() -> tuple[BackendRow, ...]:
    """The backends that have a section of their own in the job file."""
    return tuple(b for b in BACKENDS if b.settings is not None)


def host_gpus(job: Any, accelerators: int | None) -> int | None:
    """GPUs per host of the job (a JobConfig) whose instance type has `accelerators` (None: unknown)."""
    row = named(job.backend_name)
    return load(row.host_gpus)(getattr(job, row.name, None), accelerators) if row.host_gpus else accelerators


def load(path: str) -> Any:
    """What a "module:name" of the table names."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def with_backends(name: str, base: type) -> type:
    """A pydantic class `name` deriving from `base` with the field `backend` (one of the table's names)
    and each backend's section (`slurm:`, ...)."""
    # pydantic loads here, with the job's models: the CLI reads the names without it (start-up time).
    from pydantic import Field, create_model

    sections = {b.name: (load(b.settings) | None, Field(None, description=b.settings_description))
                for b in with_sections()}
    return create_model(name, __base__=base, backend=(
        Literal[names()] | None,
        Field(None, description="Where the job runs (default: local for instance_type local/local_gpu, else "
                                "sagemaker)."),
    ), **sections)
