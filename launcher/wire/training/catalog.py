"""Instance catalog: every GPU and Trainium SageMaker training instance type, CPU types, local.

The table below is plain literals so that importing this module reads no file and imports neither
boto3, botocore nor torch (it sits on the CLI start-up path). botocore's SageMaker service model is
read lazily, only by `botocore_training_instance_types()` and for CPU types this table lacks.

Figures as of 2026-11-22, and where they come from:

- Accelerator TFLOPS are dense (no 2:4 sparsity), per accelerator, from NVIDIA datasheets:
  A100 (312 bf16), H100/H200 SXM (989 bf16, 1979 fp8), L4 (121/242), L40S (362/733), HGX B200 and
  HGX B300 (36 PFLOPS bf16 / 72 PFLOPS fp8 per 8 GPUs with sparsity, so 2250/4500 dense per GPU),
  GB200 NVL72 (360/720 PFLOPS per 72 GPUs with sparsity, so 2500/5000 dense), V100 (125 fp16),
  T4 (65 fp16). A10G (AWS-only part): ~70 bf16, as reported by AWS/Baseten, not an NVIDIA sheet.
  RTX PRO 6000 / 4500 Blackwell Server Edition: derived from NVIDIA's FP4 "AI TOPS" (4000 and
  ~1700, sparse) by halving per step (sparse->dense, fp4->fp8, fp8->bf16); approximate.
  Trainium: AWS Neuron architecture docs (Trainium 190 bf16 / 32 GiB; Trainium2 667 bf16,
  1299 fp8 / 96 GiB per chip).
- Accelerator memory is the vendor's nominal figure (GB and GiB are not told apart here; CUDA
  reports a few percent less as usable). B200/B300/GB200 use the per-GPU share of AWS's instance
  totals (1440 GB, 2.1 TB, 13.4 TB per 72), which is what the instance exposes.
- Instance vCPUs, host memory and GPU counts: AWS EC2 accelerated-computing instance
  specifications (docs.aws.amazon.com/ec2/latest/instancetypes/ac.html), cross-checked against
  the SageMaker HyperPod CLI's instance table.
- EFA: the EC2 user guide's list of EFA-supported instance types, by Nitro/EFA version
  (docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa.html). `efa` is True where the instance has
  EFA *with device RDMA* (p4d/p4de: RDMA read; EFA v2 and later: read and write). p3dn, g4dn and
  g5 have first-generation EFA without RDMA, so they are False. This is the hardware; the
  variables the container sets follow the sagemaker-training toolkit's own instance lists
  (container/toolkit/torchrun_env.py), which name fewer types.
- EFA interfaces (`EFA_INTERFACES`, what a Kubernetes pod asks of the EFA device plugin as
  `vpc.amazonaws.com/efa`): one EFA interface per network card, as AWS recommends ("Maximize network
  bandwidth on Amazon EC2 instances with multiple network cards", docs.aws.amazon.com/AWSEC2/latest/
  UserGuide/efa-acc-inst-types.html), so the instance's network cards (EC2 accelerated-computing
  "Network specifications", docs.aws.amazon.com/ec2/latest/instancetypes/ac.html#ac_network). Each
  line below says its source; a type with EFA and no figure here has none in the table (its pods ask
  for the count the job file gives).
- Bandwidths, for the planner's communication model (docs/planner.md): `link_gb_s` is one GPU's
  GPU-to-GPU bandwidth inside a host in ONE direction, half of NVIDIA's bidirectional figure
  (A100 SXM NVLink 3: 600 GB/s -> 300; H100/H200 SXM NVLink 4: 900 -> 450; B200/B300/GB200
  NVLink 5: 1.8 TB/s -> 900; GPUs without NVLink talk over PCIe 4.0 x16, 32 GB/s per direction,
  or 5.0 x16, 64). `network_gbps` is the instance's network bandwidth, the "Network bandwidth
  (Gbps)" of the EC2 accelerated-computing specifications (EFA on p4d/p4de 4 x 100, p5/p5e/p5en
  and p6-b200 3200, p6-b300 6400, p6e-gb200 1600; g5/g6/g6e from 10 to 400, "up to" figures of
  the small sizes taken at face value); None where no figure was found (g7, g7e) and for types
  the planner gives no throughput (pre-Ampere, Trainium, CPU).
- Prices: on-demand USD per hour of the ml.* *training* instance in us-east-1 (AWS SageMaker
  pricing page, aws.amazon.com/sagemaker/pricing, which renders its tables client-side, so not
  every figure could be re-read). Each line says how sure it is: `list` = an AWS Price List API
  rate as quoted by third-party extracts, for us-west-2, assumed equal in us-east-1 as SageMaker's
  rates for these families usually are; `page` = the pricing page as last read, not re-verified;
  `est` = estimated as the EC2 on-demand rate times SageMaker's usual training mark-up (x1.15 for
  P and Trn, x1.25 for G sizes above xlarge); `None` = no public on-demand rate found. P4/P5
  rates include AWS's June 2025 price cut. Planning figures, not quotes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class Accelerator:
    model: str  # "NVIDIA A100 40GB"
    memory_gib: float
    compute_capability: tuple[int, int] | None  # None for Trainium
    fp8: bool
    bf16_tflops: float | None  # dense, per accelerator
    fp8_tflops: float | None
    vendor: str  # "nvidia" | "aws"
    # GPU-to-GPU bandwidth inside a host, GB/s in ONE direction per GPU (the planner's collectives
    # send and receive at once, each direction at this rate); None where the planner has no figure
    link_gb_s: float | None = None
    link: str | None = None  # "NVLink 3 (NVSwitch)", "PCIe 4.0 x16"


@dataclass(frozen=True)
class InstanceType:
    name: str  # canonical "ml.p5.48xlarge", or "local" / "local_gpu"
    accelerators: int | None  # 0 for CPU; None for local_gpu (detected at run time)
    accelerator: Accelerator | None
    vcpus: int | None
    memory_gib: float | None
    efa: bool
    usd_per_hour: float | None
    network_gbps: float | None = None  # the instance's network (EFA where it has one), Gbit/s; None: unknown

    @property
    def family(self) -> str:
        """"p5", "g5", "p6-b200"; the pseudo types are their own family ("local", "local_gpu")."""
        return self.name.split(".")[1] if self.name.startswith("ml.") else self.name

    @property
    def is_local(self) -> bool:
        return self.name in LOCAL_TYPES

    @property
    def has_fp8(self) -> bool:
        return self.accelerator is not None and self.accelerator.fp8

    @property
    def efa_interfaces(self) -> int | None:
        """How many EFA interfaces a node of this type has (EFA_INTERFACES); None where unknown."""
        return EFA_INTERFACES.get(self.name)


LOCAL_TYPES = ("local", "local_gpu")


def _nvidia(model: str, memory_gib: float, cc: tuple[int, int], bf16: float | None,
            fp8: float | None = None, link: tuple[str, float] | None = None) -> Accelerator:
    # FP8 here means what this project runs: CUDA FP8 matmuls (Transformer Engine, torchao), which
    # need FP8 tensor cores, i.e. compute capability 8.9 (Ada) or later.
    name, gb_s = link or (None, None)
    return Accelerator(model, memory_gib, cc, cc >= (8, 9), bf16, fp8, "nvidia", gb_s, name)


# Intra-host GPU links, GB/s per direction per GPU: NVIDIA quotes NVLink as the bidirectional total
# (A100 600 GB/s, H100/H200 900 GB/s, Blackwell 1.8 TB/s) and PCIe x16 as 64 / 128 GB/s for
# 4.0 / 5.0 in both directions together; each is halved here.
NVLINK3 = ("NVLink 3 (NVSwitch)", 300.0)
NVLINK4 = ("NVLink 4 (NVSwitch)", 450.0)
NVLINK5 = ("NVLink 5 (NVSwitch)", 900.0)
PCIE4 = ("PCIe 4.0 x16, no NVLink", 32.0)
PCIE5 = ("PCIe 5.0 x16, no NVLink", 64.0)


def _trainium(model: str, memory_gib: float, bf16: float) -> Accelerator:
    # Trainium has FP8 hardware (cFP8 on Trainium, 1299 dense TFLOPS on Trainium2), but it is
    # reached through the Neuron compiler, not CUDA: Transformer Engine and torchao's float8 cannot
    # run there, so for this project's `fp8` switch Trainium counts as "no FP8".
    return Accelerator(model, memory_gib, None, False, bf16, None, "aws")


# Pre-Ampere GPUs have no bfloat16 tensor cores (torch emulates bf16 there, slowly), so their
# bf16_tflops is None rather than their fp16 figure; the fp16 figure is in the comment.
K80 = _nvidia("NVIDIA K80 (one GK210 die)", 12, (3, 7), None)  # no tensor cores
V100_16 = _nvidia("NVIDIA V100 16GB", 16, (7, 0), None)  # fp16 tensor: 125
V100_32 = _nvidia("NVIDIA V100 32GB", 32, (7, 0), None)  # fp16 tensor: 125
T4 = _nvidia("NVIDIA T4", 16, (7, 5), None)  # fp16 tensor: 65
A10G = _nvidia("NVIDIA A10G", 24, (8, 6), 70, link=PCIE4)  # approximate, see module docstring
A100_40 = _nvidia("NVIDIA A100 40GB", 40, (8, 0), 312, link=NVLINK3)
A100_80 = _nvidia("NVIDIA A100 80GB", 80, (8, 0), 312, link=NVLINK3)
L4 = _nvidia("NVIDIA L4", 24, (8, 9), 121, 242, PCIE4)
L40S = _nvidia("NVIDIA L40S", 48, (8, 9), 362, 733, PCIE4)
H100 = _nvidia("NVIDIA H100 80GB", 80, (9, 0), 989, 1979, NVLINK4)
H200 = _nvidia("NVIDIA H200 141GB", 141, (9, 0), 989, 1979, NVLINK4)
B200 = _nvidia("NVIDIA B200", 180, (10, 0), 2250, 4500, NVLINK5)
GB200 = _nvidia("NVIDIA GB200 (Blackwell GPU)", 186, (10, 0), 2500, 5000, NVLINK5)
B300 = _nvidia("NVIDIA B300 (Blackwell Ultra)", 268, (10, 3), 2250, 4500, NVLINK5)
# RTX PRO TFLOPS are approximate (see the module docstring).
RTX_PRO_6000 = _nvidia("NVIDIA RTX PRO 6000 Blackwell Server Edition", 96, (12, 0), 500, 1000, PCIE5)
RTX_PRO_4500 = _nvidia("NVIDIA RTX PRO 4500 Blackwell Server Edition", 32, (12, 0), 210, 420, PCIE5)
TRAINIUM = _trainium("AWS Trainium", 32, 190)
TRAINIUM2 = _trainium("AWS Trainium2", 96, 667)


def _acc(name: str, n: int, acc: Accelerator, vcpus: int, mem: float, efa: bool,
         usd: float | None, gbps: float | None = None) -> InstanceType:
    return InstanceType("ml." + name, n, acc, vcpus, mem, efa, usd, gbps)


# Trainium counts are chips (the unit of the TFLOPS and memory figures). Neuron runs one process
# per NeuronCore: 2 per Trainium chip, 4 logical cores per Trainium2 chip at the default LNC=2.
_ACCELERATED = (
    # name                 accel  type          vCPU  GiB   EFA    USD/h     network Gbit/s
    _acc("p2.xlarge",          1, K80,             4,   61, False, 1.125),   # page
    _acc("p2.8xlarge",         8, K80,            32,  488, False, 8.64),    # page
    _acc("p2.16xlarge",       16, K80,            64,  732, False, 17.28),   # page
    _acc("p3.2xlarge",         1, V100_16,         8,   61, False, 3.825),   # page
    _acc("p3.8xlarge",         4, V100_16,        32,  244, False, 14.688),  # page
    _acc("p3.16xlarge",        8, V100_16,        64,  488, False, 28.152),  # page
    _acc("p3dn.24xlarge",      8, V100_32,        96,  768, False, 35.894),  # page; EFA v1, no RDMA
    _acc("p4d.24xlarge",       8, A100_40,        96, 1152, True,  25.2513, 400),  # list
    _acc("p4de.24xlarge",      8, A100_80,        96, 1152, True,  31.5642, 400),  # est (EC2, post-cut)
    _acc("p5.4xlarge",         1, H100,           16,  256, True,  7.912, 100),   # est (1/8 of p5.48xl)
    _acc("p5.48xlarge",        8, H100,          192, 2048, True,  63.296, 3200),  # list
    _acc("p5e.48xlarge",       8, H200,          192, 2048, True,  72.7904, 3200),  # est, as p5en
    _acc("p5en.48xlarge",      8, H200,          192, 2048, True,  72.7904, 3200),  # est (EC2 63.296)
    _acc("p6-b200.48xlarge",   8, B200,          192, 2048, True,  131.0227, 3200),  # est (EC2 113.93)
    _acc("p6-b300.48xlarge",   8, B300,          192, 4096, True,  None, 6400),    # no rate found
    _acc("p6e-gb200.36xlarge", 4, GB200,         144,  960, True,  None, 1600),    # training plans only
    _acc("g4dn.xlarge",        1, T4,              4,   16, False, 0.7364),  # list
    _acc("g4dn.2xlarge",       1, T4,              8,   32, False, 0.94),    # list
    _acc("g4dn.4xlarge",       1, T4,             16,   64, False, 1.505),   # page
    _acc("g4dn.8xlarge",       1, T4,             32,  128, False, 2.72),    # page; EFA v1, no RDMA
    _acc("g4dn.12xlarge",      4, T4,             48,  192, False, 4.89),    # page; EFA v1, no RDMA
    _acc("g4dn.16xlarge",      1, T4,             64,  256, False, 5.44),    # page; EFA v1, no RDMA
    _acc("g5.xlarge",          1, A10G,            4,   16, False, 1.408, 10),   # list
    _acc("g5.2xlarge",         1, A10G,            8,   32, False, 1.515, 10),   # list
    _acc("g5.4xlarge",         1, A10G,           16,   64, False, 2.03, 25),    # list
    _acc("g5.8xlarge",         1, A10G,           32,  128, False, 3.06, 25),    # list; EFA v1, no RDMA
    _acc("g5.12xlarge",        4, A10G,           48,  192, False, 7.09, 40),    # list; EFA v1, no RDMA
    _acc("g5.16xlarge",        1, A10G,           64,  256, False, 5.12, 25),    # list; EFA v1, no RDMA
    _acc("g5.24xlarge",        4, A10G,           96,  384, False, 10.18, 50),   # list; EFA v1, no RDMA
    _acc("g5.48xlarge",        8, A10G,          192,  768, False, 20.36, 100),   # list; EFA v1, no RDMA
    _acc("g6.xlarge",          1, L4,              4,   16, False, 1.1267, 10),  # list
    _acc("g6.2xlarge",         1, L4,              8,   32, False, 1.222, 10),   # list
    _acc("g6.4xlarge",         1, L4,             16,   64, False, 1.654, 25),   # list
    _acc("g6.8xlarge",         1, L4,             32,  128, True,  2.518, 25),   # list
    _acc("g6.12xlarge",        4, L4,             48,  192, True,  5.752, 40),   # list
    _acc("g6.16xlarge",        1, L4,             64,  256, True,  4.246, 25),   # est (EC2 3.3968)
    _acc("g6.24xlarge",        4, L4,             96,  384, True,  8.344, 50),   # list
    _acc("g6.48xlarge",        8, L4,            192,  768, True,  16.688, 100),  # list
    _acc("g6e.xlarge",         1, L40S,            4,   32, False, 2.6054, 20),  # list
    _acc("g6e.2xlarge",        1, L40S,            8,   64, False, 2.8026, 20),  # list
    _acc("g6e.4xlarge",        1, L40S,           16,  128, False, 3.7553, 20),  # list
    _acc("g6e.8xlarge",        1, L40S,           32,  256, True,  5.6607, 25),  # list
    _acc("g6e.12xlarge",       4, L40S,           48,  384, True,  13.1158, 100),  # list
    _acc("g6e.16xlarge",       1, L40S,           64,  512, True,  9.4715, 35),  # est (EC2 7.5772)
    _acc("g6e.24xlarge",       4, L40S,           96,  768, True,  18.832, 200),  # list
    _acc("g6e.48xlarge",       8, L40S,          192, 1536, True,  37.664, 400),  # list
    _acc("g7.2xlarge",         1, RTX_PRO_4500,    8,   32, False, None),    # no rate found (new)
    _acc("g7.4xlarge",         1, RTX_PRO_4500,   16,   64, False, None),    # no rate found
    _acc("g7.8xlarge",         2, RTX_PRO_4500,   32,  128, True,  None),    # no rate; 2 GPUs?
    _acc("g7.12xlarge",        4, RTX_PRO_4500,   48,  192, True,  None),    # no rate found
    _acc("g7.24xlarge",        4, RTX_PRO_4500,   96,  384, True,  None),    # no rate found
    _acc("g7.48xlarge",        8, RTX_PRO_4500,  192,  768, True,  None),    # no rate found
    _acc("g7e.2xlarge",        1, RTX_PRO_6000,    8,   64, False, 4.2039),  # list
    _acc("g7e.4xlarge",        1, RTX_PRO_6000,   16,  128, False, 4.9977),  # list
    _acc("g7e.8xlarge",        1, RTX_PRO_6000,   32,  256, True,  6.5853),  # list
    _acc("g7e.12xlarge",       2, RTX_PRO_6000,   48,  512, True,  10.3576),  # list
    _acc("g7e.24xlarge",       4, RTX_PRO_6000,   96, 1024, True,  20.7152),  # list
    _acc("g7e.48xlarge",       8, RTX_PRO_6000,  192, 2048, True,  41.4304),  # list
    _acc("trn1.2xlarge",       1, TRAINIUM,        8,   32, False, 1.5453),  # est (EC2 1.34375)
    _acc("trn1.32xlarge",     16, TRAINIUM,      128,  512, True,  24.725),  # est (EC2 21.50)
    _acc("trn1n.32xlarge",    16, TRAINIUM,      128,  512, True,  28.497),  # est (EC2 24.78)
    _acc("trn2.48xlarge",     16, TRAINIUM2,     192, 2048, True,  None),    # no rate found
)

# EFA interfaces per node: one per network card (see the module docstring). "EC2": the EC2 network
# specifications' network cards; "EFA guide": the EC2 user guide's "P5 and P5e instances support up to
# 32 network cards" and "G6e instances support up to four network cards"; "torchx": torchx's
# specs/named_resources_aws.py (vpc.amazonaws.com/efa devices), which agrees with each figure it has.
EFA_INTERFACES = {
    "ml.p4d.24xlarge": 4,     # EC2 (4 network cards, 4 x 100 Gbps); torchx
    "ml.p4de.24xlarge": 4,    # EC2 (as p4d); torchx
    "ml.p5.48xlarge": 32,     # EFA guide (32 network cards, 3200 Gbps); EC2; torchx
    "ml.p5e.48xlarge": 32,    # EFA guide (P5e as P5); torchx
    "ml.p5en.48xlarge": 16,   # EC2 (16 network cards of 200 Gbps EFAv3, 3200 Gbps); torchx
    "ml.g6e.24xlarge": 2,     # EC2 (2 network cards, 200 Gbps); torchx
    "ml.g6e.48xlarge": 4,     # EFA guide (up to four network cards, 400 Gbps); torchx
}

# CPU families of SageMaker's TrainingInstanceType enum (botocore 1.44): GiB per vCPU, and sizes
# ("xlarge", and N for "Nxlarge").
# vCPUs follow the size (large = 2, xlarge = 4, Nxlarge = 4N); host memory is vCPUs times the
# family's GiB per vCPU, except where the family is irregular (_CPU_MEMORY_GIB).
_CPU_FAMILIES = {
    "c4": (1.875, "xlarge 2 4 8"),
    "c5": (2, "xlarge 2 4 9 18"),
    "c5n": (None, "xlarge 2 4 9 18"),
    "c6i": (2, "xlarge 2 4 8 12 16 24 32"),
    "c7i": (2, "large xlarge 2 4 8 12 16 24 48"),
    "c7i-flex": (2, "xlarge 2 4 8 12 16"),
    "c8i": (2, "xlarge 2 4 8 12 16 24 32 48 96"),
    "c8i-flex": (2, "xlarge 2 4 8 12 16"),
    "m4": (4, "xlarge 2 4 10 16"),
    "m5": (4, "large xlarge 2 4 12 24"),
    "m6i": (4, "large xlarge 2 4 8 12 16 24 32"),
    "m7i": (4, "large xlarge 2 4 8 12 16 24 48"),
    "m7i-flex": (4, "large xlarge 2 4 8 12 16"),
    "m8i": (4, "large xlarge 2 4 8 12 16 24 32 48 96"),
    "m8i-flex": (4, "large xlarge 2 4 8 12 16"),
    "r5": (8, "large xlarge 2 4 8 12 16 24"),
    "r5d": (8, "large xlarge 2 4 8 12 16 24"),
    "r6i": (8, "large xlarge 2 4 8 12 16 24 32"),
    "r7i": (8, "large xlarge 2 4 8 12 16 24 48"),
    "r8i": (8, "large xlarge 2 4 8 12 16 24 32 48 96"),
    "r8i-flex": (8, "large xlarge 2 4 8 12 16"),
    "t3": (4, "medium large xlarge 2"),
}
_CPU_MEMORY_GIB = {
    "ml.c5n.xlarge": 10.5, "ml.c5n.2xlarge": 21, "ml.c5n.4xlarge": 42, "ml.c5n.9xlarge": 96,
    "ml.c5n.18xlarge": 192, "ml.t3.medium": 4,
}

# Families that carry accelerators. An enum type outside the table is taken for a CPU type only
# when its family is not one of these, so a new GPU family is never mistaken for a CPU one.
_ACCELERATOR_FAMILY_PREFIXES = ("p", "g", "trn", "inf", "dl")


def _vcpus(size: str) -> int | None:
    if size in ("medium", "large"):
        return 2
    if size.endswith("xlarge") and (size[:-6] == "" or size[:-6].isdigit()):
        return 4 * int(size[:-6] or 1)
    return None


def _cpu(name: str, gib_per_vcpu: float | None = None) -> InstanceType:
    vcpus = _vcpus(name.rsplit(".", 1)[1])
    memory = _CPU_MEMORY_GIB.get(name)
    if memory is None and gib_per_vcpu is not None and vcpus is not None:
        memory = vcpus * gib_per_vcpu
    return InstanceType(name, 0, None, vcpus, memory, False, None)


_CATALOG: dict[str, InstanceType] = {
    "local": InstanceType("local", 0, None, None, None, False, None),
    # The GPUs of this machine: how many and which are only known where the job runs.
    "local_gpu": InstanceType("local_gpu", None, None, None, None, False, None),
}
_CATALOG.update((t.name, t) for t in _ACCELERATED)
_CATALOG.update(
    (f"ml.{fam}.{size}", _cpu(f"ml.{fam}.{size}", ratio))
    for fam, (ratio, sizes) in _CPU_FAMILIES.items()
    for size in (s + "xlarge" if s.isdigit() else s for s in sizes.split())
)


def normalize_instance_type(name: str) -> str:
    """"p5.48xlarge", " ML.P5.48xlarge " -> "ml.p5.48xlarge"; "local" and "local_gpu" stay."""
    canonical = "".join(name.split()).lower()
    if not canonical or canonical in LOCAL_TYPES or canonical.startswith("ml."):
        return canonical
    return "ml." + canonical


def get_instance_type(name: str) -> InstanceType | None:
    """The entry for `name` (with or without "ml."); None if neither we nor SageMaker know it.

    A SageMaker training type of a CPU family that the table lacks is described generically
    (no accelerators, vCPUs from its size); that one lookup reads botocore's service model.
    """
    canonical = normalize_instance_type(name)
    found = _CATALOG.get(canonical)
    if found is not None or not canonical.startswith("ml."):
        return found
    family = canonical.split(".")[1]
    if family.startswith(_ACCELERATOR_FAMILY_PREFIXES):
        return None
    if canonical in botocore_training_instance_types():
        return _cpu(canonical)
    return None


def catalog_names() -> list[str]:
    """Every canonical name in the table: local, local_gpu, accelerated and CPU types."""
    return sorted(_CATALOG)


def fp8_instance_types() -> list[str]:
    """Canonical names of the instance types whose accelerators run CUDA FP8, sorted."""
    return sorted(name for name, t in _CATALOG.items() if t.has_fp8)


@lru_cache(maxsize=1)
def botocore_training_instance_types() -> frozenset[str]:
    """SageMaker's TrainingInstanceType enum, read from the installed botocore's service model.

    botocore is located, not imported (importing it costs ~100 ms); empty if it is not installed
    or its model cannot be read.
    """
    import glob
    import gzip
    import importlib.util
    import json
    import os

    try:
        spec = importlib.util.find_spec("botocore")
    except (ImportError, ValueError):
        return frozenset()
    if spec is None or not spec.submodule_search_locations:
        return frozenset()
    for package_dir in spec.submodule_search_locations:
        models = glob.glob(os.path.join(package_dir, "data", "sagemaker", "*", "service-2.json*"))
        for path in sorted(models, reverse=True):  # newest API version first
            opener = gzip.open if path.endswith(".gz") else open
            try:
                with opener(path, "rt", encoding="utf-8") as f:
                    model = json.load(f)
                return frozenset(model["shapes"]["TrainingInstanceType"]["enum"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
    return frozenset()
