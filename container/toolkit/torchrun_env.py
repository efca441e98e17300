"""The NCCL and EFA variables sagemaker-training 5.1.4 gives a torchrun job, per instance type.

Source: `sagemaker_training/torch_distributed.py`, `TorchDistributedRunner._setup()`, with the
instance lists `SM_EFA_NCCL_INSTANCES` and `SM_EFA_RDMA_INSTANCES` of
`sagemaker_training/__init__.py`. What the toolkit does there, and so what this module does:

- only for torchrun (`sagemaker_torch_distributed_enabled`); a plain `python <program>` job
  gets none of these (its ProcessRunner has no `_setup`);
- `NCCL_PROTO=simple` and `NCCL_SOCKET_IFNAME=<network_interface_name of resourceconfig.json>`
  on every instance type;
- `FI_PROVIDER=efa` on the types of `SM_EFA_NCCL_INSTANCES`, and `FI_EFA_USE_DEVICE_RDMA=1`,
  `RDMAV_FORK_SAFE=1` on those of `SM_EFA_RDMA_INSTANCES`, matched by exact name: an instance
  type missing from the lists (ml.p5en.48xlarge, ml.p6-b200.48xlarge, ml.trn2.48xlarge, ...)
  gets none of the three, whatever its hardware;
- it assigns `os.environ[...]`, overwriting a value the job's own environment set.

docs/container.md documents the table; tests/integration/test_toolkit_parity.py checks it against the
installed toolkit.
"""

from __future__ import annotations

_EFA = {"FI_PROVIDER": "efa"}
# RDMAV_FORK_SAFE: a rank that forks after registering memory with the NIC (DataLoader workers)
# can otherwise abort.
_EFA_RDMA = {**_EFA, "FI_EFA_USE_DEVICE_RDMA": "1", "RDMAV_FORK_SAFE": "1"}

# instance type -> what the toolkit adds for it (SM_EFA_NCCL_INSTANCES, SM_EFA_RDMA_INSTANCES)
EFA_VARIABLES: dict[str, dict[str, str]] = {
    "ml.g4dn.8xlarge": _EFA,
    "ml.g4dn.12xlarge": _EFA,
    "ml.g5.48xlarge": _EFA,
    "ml.p3dn.24xlarge": _EFA,
    "ml.p4d.24xlarge": _EFA_RDMA,
    "ml.p4de.24xlarge": _EFA_RDMA,
    "ml.p5.48xlarge": _EFA_RDMA,
    "ml.p5e.48xlarge": _EFA_RDMA,
    "ml.trn1.32xlarge": _EFA_RDMA,
    "ml.p6e-gb200.36xlarge": _EFA_RDMA,
}

# every torchrun job, whatever its instance type ("simple": EFA delivers out of order)
TORCHRUN_VARIABLES = {"NCCL_PROTO": "simple"}


def torchrun_variables(instance_type: str, network_interface_name: str) -> dict[str, str]:
    """The variables the toolkit sets before it starts torchrun on `instance_type`."""
    return {
        **EFA_VARIABLES.get(instance_type, {}),
        "NCCL_SOCKET_IFNAME": network_interface_name,
        **TORCHRUN_VARIABLES,
    }
