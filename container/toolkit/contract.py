"""Read the SageMaker `/opt/ml` tree and derive what the sagemaker-training toolkit (5.x) derives.

`read_training_env()` snapshots the tree into a `TrainingEnv`; `sm_environment()` turns it into
the `SM_*` variables exactly as the toolkit's `Environment.to_env_vars()` does, and
`to_cmd_args()` into the script's arguments as `mapping.to_cmd_args()` does, so a script written
for AWS's PyTorch images sees the same environment here. The one deliberate difference: `smlaunch_*`
hyperparameters are ours and, like the toolkit's `sagemaker_*` ones, are framework parameters
rather than user hyperparameters. No torch at import: GPUs are counted lazily.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.wire.hyperparameters import RESERVED_PREFIXES, decode

BASE_DIR_ENV = "SAGEMAKER_BASE_DIR"
DEFAULT_BASE_DIR = "/opt/ml"

# sagemaker_training.params.SAGEMAKER_HYPERPARAMETERS: reserved keys that are *not* reported as
# framework parameters (SM_FRAMEWORK_PARAMS); the other reserved keys are.
TOOLKIT_HYPERPARAMETERS = (
    "sagemaker_program",
    "sagemaker_submit_directory",
    "sagemaker_enable_cloudwatch_metrics",
    "sagemaker_region",
    "sagemaker_container_log_level",
    "sagemaker_job_name",
    "default_user_module_name",
    "_tuning_objective_metric",
    "sagemaker_s3_output",
)
# Any of these puts the current instance group among the distribution groups (the toolkit's
# get_distribution_instance_groups_from_resource_config).
_DISTRIBUTION_FLAGS = (
    "sagemaker_mpi_enabled",
    "sagemaker_parameter_server_enabled",
    "sagemaker_distributed_dataparallel_enabled",
    "sagemaker_pytorch_ddp_enabled",
    "sagemaker_pytorch_xla_multi_worker_enabled",
    "sagemaker_multi_worker_mirrored_strategy_enabled",
    "sagemaker_torch_distributed_enabled",
)
_LOG_LEVEL_INFO = 20  # logging.INFO, the toolkit's default sagemaker_container_log_level


class ContractError(Exception):
    """The job cannot run as described: no program, an unsupported launcher, bad settings."""


def base_dir_from_env() -> Path:
    return Path(os.environ.get(BASE_DIR_ENV, DEFAULT_BASE_DIR))


@dataclass(frozen=True)
class TrainingEnv:
    """A read-only snapshot of one host's training environment (the toolkit's `Environment`)."""

    base_dir: Path
    hyperparameters: dict[str, Any]  # every key, decoded (json.loads, else the raw string)
    resource_config: dict[str, Any]
    input_data_config: dict[str, Any]
    num_gpus: int
    num_cpus: int
    num_neurons: int
    program_env: str | None  # SAGEMAKER_PROGRAM: an image with baked-in code names its script
    framework_module: str | None  # SAGEMAKER_TRAINING_MODULE
    job_name: str | None  # TRAINING_JOB_NAME, set by the SageMaker platform
    smddpmprun_installed: bool
    smddprun_installed: bool

    # --- paths ------------------------------------------------------------------------------
    @property
    def code_dir(self) -> Path:
        return self.base_dir / "code"

    @property
    def model_dir(self) -> Path:
        return self.base_dir / "model"

    @property
    def input_dir(self) -> Path:
        return self.base_dir / "input"

    @property
    def input_config_dir(self) -> Path:
        return self.input_dir / "config"

    @property
    def output_dir(self) -> Path:
        return self.base_dir / "output"

    @property
    def output_data_dir(self) -> Path:
        return self.output_dir / "data"

    @property
    def output_intermediate_dir(self) -> Path:
        return self.output_dir / "intermediate"

    @property
    def channel_input_dirs(self) -> dict[str, str]:
        return {name: str(self.input_dir / "data" / name) for name in self.input_data_config}

    # --- cluster ----------------------------------------------------------------------------
    @property
    def current_host(self) -> str:
        return self.resource_config["current_host"]

    @property
    def hosts(self) -> list[str]:
        return list(self.resource_config["hosts"])

    @property
    def current_instance_type(self) -> str:
        return self.resource_config.get("current_instance_type", "local")

    @property
    def current_instance_group(self) -> str:
        return self.resource_config.get("current_group_name", "homogeneousCluster")

    @property
    def network_interface_name(self) -> str:
        return self.resource_config.get("network_interface_name", "eth0")

    @property
    def instance_groups_dict(self) -> dict[str, dict]:
        groups = self.resource_config.get("instance_groups", [])
        return {g["instance_group_name"]: g for g in groups}

    @property
    def current_instance_group_hosts(self) -> list[str]:
        return list(self.instance_groups_dict.get(self.current_instance_group, {}).get("hosts", []))

    @property
    def distribution_instance_groups(self) -> list[str]:
        explicit = self.framework_params.get("sagemaker_distribution_instance_groups")
        if explicit is not None:
            return explicit
        if any(self.framework_params.get(flag, False) for flag in _DISTRIBUTION_FLAGS):
            return [self.current_instance_group]
        return []

    @property
    def distribution_hosts(self) -> list[str]:
        groups = self.instance_groups_dict
        if not groups:  # local mode writes no instance groups
            return self.hosts
        return [h for name in self.distribution_instance_groups for h in groups[name]["hosts"]]

    @property
    def master_hostname(self) -> str:
        return (self.distribution_hosts or self.hosts)[0]

    # --- hyperparameters --------------------------------------------------------------------
    @property
    def user_hyperparameters(self) -> dict[str, Any]:
        return {k: v for k, v in self.hyperparameters.items() if not _reserved(k)}

    @property
    def framework_params(self) -> dict[str, Any]:
        """Reserved keys other than the toolkit's own (additional_framework_parameters)."""
        return {
            k: v for k, v in self.hyperparameters.items()
            if _reserved(k) and k not in TOOLKIT_HYPERPARAMETERS
        }

    @property
    def user_entry_point(self) -> str | None:
        return self.program_env or self.hyperparameters.get("sagemaker_program")

    @property
    def module_name(self) -> str:
        # str() of a missing program is "None", as in the toolkit.
        name = str(self.program_env or self.hyperparameters.get("sagemaker_program"))
        return name.removesuffix(".py")

    @property
    def module_dir(self) -> str:
        return str(self.hyperparameters.get("sagemaker_submit_directory", self.code_dir))

    @property
    def log_level(self) -> Any:
        return self.hyperparameters.get("sagemaker_container_log_level", _LOG_LEVEL_INFO)

    @property
    def torch_distributed(self) -> bool:
        return bool(self.hyperparameters.get("sagemaker_torch_distributed_enabled", False))

    @property
    def is_modelparallel_enabled(self) -> bool | str | None:
        # As the toolkit computes it: from SM_HP_MP_PARAMETERS in the *bootstrap's* environment
        # (`value and value != "{}"`), which SageMaker does not set, so on AWS it is None.
        value = os.environ.get("SM_HP_MP_PARAMETERS")
        return value and value != "{}"


def _reserved(key: str) -> bool:
    return key.startswith(RESERVED_PREFIXES) or key in TOOLKIT_HYPERPARAMETERS


def read_training_env(
    base_dir: Path | None = None, *, num_gpus: int | None = None
) -> TrainingEnv:
    """Snapshot the tree under `base_dir` (default: $SAGEMAKER_BASE_DIR, else /opt/ml).

    `num_gpus` defaults to torch.cuda.device_count() (0 without an NVIDIA device or torch).
    """
    base = Path(base_dir) if base_dir is not None else base_dir_from_env()
    config_dir = base / "input" / "config"
    resource_config = _read_json(config_dir / "resourceconfig.json")
    for key in ("current_host", "hosts"):
        if key not in resource_config:
            raise ValueError(f"{config_dir / 'resourceconfig.json'} has no {key!r}")
    data_config_path = config_dir / "inputdataconfig.json"
    return TrainingEnv(
        base_dir=base,
        hyperparameters=decode(_read_json(config_dir / "hyperparameters.json")),
        resource_config=resource_config,
        input_data_config=_read_json(data_config_path) if data_config_path.exists() else {},
        num_gpus=count_gpus() if num_gpus is None else num_gpus,
        num_cpus=os.cpu_count() or 1,
        num_neurons=count_neuron_cores(),
        program_env=os.environ.get("SAGEMAKER_PROGRAM"),
        framework_module=os.environ.get("SAGEMAKER_TRAINING_MODULE"),
        job_name=os.environ.get("TRAINING_JOB_NAME"),
        smddpmprun_installed=shutil.which("smddpmprun") is not None,
        smddprun_installed=shutil.which("smddprun") is not None,
    )


def _read_json(path: Path) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def count_gpus() -> int:
    # No NVIDIA device node, nothing to count: spare the ~2 s of importing torch.
    if not glob.glob("/dev/nvidia[0-9]*"):
        return 0
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count()


def count_neuron_cores() -> int:
    """NeuronCores on this host, as the toolkit counts them (`neuron-ls -j`); 0 without Neuron."""
    if shutil.which("neuron-ls") is None:
        return 0
    try:
        out = subprocess.run(["neuron-ls", "-j"], capture_output=True, check=True, timeout=60)
        return sum(item.get("nc_count", 0) for item in json.loads(out.stdout))
    except (OSError, subprocess.SubprocessError, ValueError, AttributeError):
        return 0


def training_env_dict(env: TrainingEnv) -> dict[str, Any]:
    """The toolkit's `dict(Environment())`: every public property (SM_TRAINING_ENV)."""
    return {
        "additional_framework_parameters": env.framework_params,
        "channel_input_dirs": env.channel_input_dirs,
        "current_host": env.current_host,
        "current_instance_group": env.current_instance_group,
        "current_instance_group_hosts": env.current_instance_group_hosts,
        "current_instance_type": env.current_instance_type,
        "distribution_hosts": env.distribution_hosts,
        "distribution_instance_groups": env.distribution_instance_groups,
        "framework_module": env.framework_module,
        "hosts": env.hosts,
        "hyperparameters": env.user_hyperparameters,
        "input_config_dir": str(env.input_config_dir),
        "input_data_config": env.input_data_config,
        "input_dir": str(env.input_dir),
        "instance_groups": list(env.instance_groups_dict),
        "instance_groups_dict": env.instance_groups_dict,
        "is_hetero": len(env.instance_groups_dict) > 1,
        "is_master": env.current_host == env.master_hostname,
        "is_modelparallel_enabled": env.is_modelparallel_enabled,
        "is_smddpmprun_installed": env.smddpmprun_installed,
        "is_smddprun_installed": env.smddprun_installed,
        "job_name": env.job_name,
        "log_level": env.log_level,
        "master_hostname": env.master_hostname,
        "model_dir": str(env.model_dir),
        "module_dir": env.module_dir,
        "module_name": env.module_name,
        "network_interface_name": env.network_interface_name,
        "num_cpus": env.num_cpus,
        "num_gpus": env.num_gpus,
        "num_neurons": env.num_neurons,
        "output_data_dir": str(env.output_data_dir),
        "output_dir": str(env.output_dir),
        "output_intermediate_dir": str(env.output_intermediate_dir),
        "resource_config": env.resource_config,
        # GB200 UltraServer host-to-capacity mappings; the toolkit lists none elsewhere
        "topology": env.resource_config.get("topology", []),
        "user_entry_point": env.user_entry_point,
    }


def sm_environment(env: TrainingEnv) -> dict[str, str]:
    """The SM_* variables, as the toolkit's Environment.to_env_vars() produces them."""
    view = training_env_dict(env)
    values: dict[str, Any] = {
        "hosts": env.hosts,
        "network_interface_name": env.network_interface_name,
        "hps": env.user_hyperparameters,
        "user_entry_point": env.user_entry_point,
        "framework_params": env.framework_params,
        "resource_config": env.resource_config,
        "input_data_config": env.input_data_config,
        "output_data_dir": view["output_data_dir"],
        "channels": sorted(env.channel_input_dirs),
        "current_host": env.current_host,
        "current_instance_type": env.current_instance_type,
        "current_instance_group": env.current_instance_group,
        "current_instance_group_hosts": env.current_instance_group_hosts,
        "instance_groups": view["instance_groups"],
        "instance_groups_dict": env.instance_groups_dict,
        "distribution_instance_groups": env.distribution_instance_groups,
        "is_hetero": view["is_hetero"],
        "module_name": env.module_name,
        "log_level": env.log_level,
        "framework_module": env.framework_module,
        "input_dir": view["input_dir"],
        "input_config_dir": view["input_config_dir"],
        "output_dir": view["output_dir"],
        "num_cpus": env.num_cpus,
        "num_gpus": env.num_gpus,
        "num_neurons": env.num_neurons,
        "model_dir": view["model_dir"],
        "module_dir": env.module_dir,
        "training_env": view,
        "user_args": to_cmd_args(env.user_hyperparameters),
        "output_intermediate_dir": view["output_intermediate_dir"],
    }
    for name, path in env.channel_input_dirs.items():
        values[f"channel_{name}"] = path
    for key, value in env.user_hyperparameters.items():
        values[f"hp_{key}"] = value
    return {f"SM_{str(k).upper()}": _env_value(v) for k, v in values.items()}


def _env_value(value: Any) -> str:
    # mapping.to_env_vars: strings as they are, None as "", anything else as compact sorted JSON.
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def to_cmd_args(hyperparameters: dict[str, Any]) -> list[str]:
    """`--key value` pairs, keys sorted; values as str() (bools `True`), dicts as `k=v,k2=v2`.

    One-letter keys become `-k`, as in the toolkit's mapping.to_cmd_args.
    """
    args: list[str] = []
    for key in sorted(hyperparameters):
        name = str(key)
        args.append(f"--{name}" if len(name) > 1 else f"-{name}" if name else "")
        args.append(_arg_value(hyperparameters[key]))
    return args


def _arg_value(value: Any) -> str:
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in sorted(value.items()))
    return "" if value is None else str(value)
