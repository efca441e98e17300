"""The `distribution` dict exactly as users write it for the SageMaker SDK's PyTorch estimator.

Keys and defaults follow SMP v2 (`smdistributed.modelparallel.parameters`) and, for sharded
data parallelism, SMP v1 (their parameters: launcher.wire.training.degrees); see docs/smp.md.
Cross-field rules live in `launcher.config.rules`.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from launcher.wire.training.base import MAX_PROCESSES_PER_HOST, Strict, WholeNumber
from launcher.wire.training.degrees import ModelParallelParameters


class TorchDistributed(Strict):
    enabled: bool = Field(False, description="Launch the entry point with torchrun on every host.")


class ModelParallel(Strict):
    enabled: bool = Field(False, description="Turn on the model-parallel library.")
    parameters: ModelParallelParameters = Field(
        default_factory=ModelParallelParameters, description="Model-parallel parameters."
    )


class DataParallel(Strict):
    enabled: bool = Field(False, description="SageMaker distributed data parallel (smddp).")
    custom_mpi_options: str = Field("", description="Extra mpirun options for smddp.")


class SMDistributed(Strict):
    modelparallel: ModelParallel | None = Field(None, description="SMP (model parallelism).")
    dataparallel: DataParallel | None = Field(None, description="SMDDP (data parallelism).")


class MPI(Strict):
    enabled: bool = Field(False, description="Launch with mpirun (SMP v1 style).")
    processes_per_host: WholeNumber | None = Field(
        None, ge=1, le=MAX_PROCESSES_PER_HOST, description="MPI processes per host."
    )
    custom_mpi_options: str = Field("", description="Extra mpirun options.")


class Distribution(Strict):
    """The estimator's `distribution` argument."""

    torch_distributed: TorchDistributed | None = Field(None, description="torchrun launcher.")
    smdistributed: SMDistributed | None = Field(None, description="SageMaker distributed libraries.")
    mpi: MPI | None = Field(None, description="mpirun launcher.")
    pytorchddp: DataParallel | None = Field(
        None, description="Older spelling of smdistributed.dataparallel (the SDK rewrites it so)."
    )
    instance_groups: list[str] | None = Field(
        None, max_length=1, description="Heterogeneous clusters: the one instance group that trains."
    )

    @model_validator(mode="after")
    def _pytorchddp(self) -> Distribution:
        # As sagemaker.pytorch.PyTorch does: pytorchddp becomes smdistributed.dataparallel.
        if self.pytorchddp is not None:
            if self.smdistributed is not None:
                raise ValueError("pytorchddp and smdistributed cannot be used together (the SDK refuses "
                                 "them too); keep smdistributed.dataparallel")
            dp, self.pytorchddp = self.pytorchddp, None
            self.smdistributed = SMDistributed(dataparallel=dp)
        return self

    @property
    def torchrun(self) -> bool:
        return bool(self.torch_distributed and self.torch_distributed.enabled)

    @property
    def mpi_enabled(self) -> bool:
        return bool(self.mpi and self.mpi.enabled)

    @property
    def modelparallel(self) -> ModelParallel | None:
        mp = self.smdistributed.modelparallel if self.smdistributed else None
        return mp if mp and mp.enabled else None

    @property
    def dataparallel_enabled(self) -> bool:
        dp = self.smdistributed.dataparallel if self.smdistributed else None
        return bool(dp and dp.enabled)

    @property
    def parameters(self) -> ModelParallelParameters:
        """The model-parallel parameters in force (all defaults when SMP is off)."""
        mp = self.modelparallel
        return mp.parameters if mp else ModelParallelParameters()
