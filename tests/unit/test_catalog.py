"""The instance catalog: coverage of SageMaker's training types, figures, lookups, light import.
Here the tests that run in one process; those that start processes are tests/integration/test_catalog.py."""

from __future__ import annotations

import dataclasses

import pytest

from launcher.wire.training import catalog
from launcher.wire.training.catalog import get_instance_type, normalize_instance_type

ACCELERATED_PREFIXES = ("p", "g", "trn", "inf", "dl")
# Accelerated types with no public on-demand price (documented line by line in the catalog).
UNPRICED = {
    "ml.p6-b300.48xlarge", "ml.p6e-gb200.36xlarge", "ml.trn2.48xlarge",
    "ml.g7.2xlarge", "ml.g7.4xlarge", "ml.g7.8xlarge", "ml.g7.12xlarge", "ml.g7.24xlarge",
    "ml.g7.48xlarge",
}


def family(name: str) -> str:
    return name.split(".")[1]


@pytest.fixture(scope="module")
def enum() -> frozenset[str]:
    types = catalog.botocore_training_instance_types()
    assert types, "botocore (a boto3 dependency) is installed, so its SageMaker model must be read"
    return types


def accelerated_types() -> list[str]:
    return sorted(n for n, t in (
        (n, get_instance_type(n)) for n in catalog.catalog_names()) if t.accelerator is not None)


def test_reader_matches_botocores_own_loader(enum):
    from botocore.loaders import Loader

    model = Loader().load_service_model("sagemaker", "service-2")
    assert enum == frozenset(model["shapes"]["TrainingInstanceType"]["enum"])
    assert "ml.p5.48xlarge" in enum


def test_every_gpu_and_trainium_training_type_is_cataloged(enum):
    accelerated = sorted(n for n in enum if family(n).startswith(ACCELERATED_PREFIXES))
    assert len(accelerated) >= 50
    found = {n: get_instance_type(n) for n in accelerated}
    missing = [n for n, t in found.items() if t is None or not t.accelerators or not t.accelerator]
    assert not missing, f"add these SageMaker training types to launcher/wire/training/catalog.py: {missing}"


def test_every_training_type_resolves_and_cpu_types_have_no_accelerators(enum):
    for name in sorted(enum):
        inst = get_instance_type(name)
        assert inst is not None, name
        assert inst.name == name
        if not family(name).startswith(ACCELERATED_PREFIXES):
            assert inst.accelerators == 0 and inst.accelerator is None and not inst.has_fp8, name


def test_p4d_is_eight_a100_40gb_without_fp8():
    p4d = get_instance_type("ml.p4d.24xlarge")
    assert p4d.accelerators == 8
    assert p4d.accelerator.model == "NVIDIA A100 40GB"
    assert p4d.accelerator.memory_gib == 40
    assert p4d.accelerator.compute_capability == (8, 0)
    assert p4d.accelerator.bf16_tflops == 312
    assert not p4d.has_fp8 and p4d.accelerator.fp8_tflops is None
    assert (p4d.vcpus, p4d.memory_gib, p4d.efa) == (96, 1152, True)


def test_p5_is_eight_h100_with_fp8():
    p5 = get_instance_type("p5.48xlarge")
    assert p5.accelerators == 8
    assert "H100" in p5.accelerator.model and p5.accelerator.memory_gib == 80
    assert p5.accelerator.compute_capability == (9, 0)
    assert p5.has_fp8
    assert (p5.accelerator.bf16_tflops, p5.accelerator.fp8_tflops) == (989, 1979)
    assert (p5.vcpus, p5.memory_gib, p5.efa) == (192, 2048, True)
    assert p5.family == "p5"


@pytest.mark.parametrize("spelling", [
    "p5.48xlarge", "ml.p5.48xlarge", "ML.P5.48XLARGE", "  p5.48xlarge\n", "ml. p5.48xlarge",
])
def test_normalize_accepts_both_spellings(spelling):
    assert normalize_instance_type(spelling) == "ml.p5.48xlarge"
    assert get_instance_type(spelling) is get_instance_type("ml.p5.48xlarge")


@pytest.mark.parametrize("name", ["local", "local_gpu", " LOCAL ", "Local_GPU"])
def test_local_types_are_not_prefixed(name):
    assert normalize_instance_type(name) in ("local", "local_gpu")


def test_local_pseudo_types():
    local, local_gpu = get_instance_type("local"), get_instance_type("local_gpu")
    assert local.is_local and local.accelerators == 0 and local.family == "local"
    assert local_gpu.is_local and local_gpu.accelerators is None  # detected at run time
    assert not local_gpu.has_fp8 and not local_gpu.efa
    assert not get_instance_type("ml.p5.48xlarge").is_local


def test_fp8_instance_types():
    names = catalog.fp8_instance_types()
    assert names == sorted(names)
    for fp8 in ("ml.p5.48xlarge", "ml.p5en.48xlarge", "ml.p6-b200.48xlarge", "ml.g6e.48xlarge"):
        assert fp8 in names
    for no_fp8 in ("ml.p4d.24xlarge", "ml.p4de.24xlarge", "ml.g5.48xlarge", "ml.p3.16xlarge",
                   "ml.trn1.32xlarge", "ml.trn2.48xlarge", "ml.m5.xlarge", "local", "local_gpu"):
        assert no_fp8 not in names
    assert all(get_instance_type(n).has_fp8 for n in names)


def test_fp8_means_cuda_compute_capability_8_9_and_trainium_has_none():
    for name in accelerated_types():
        acc = get_instance_type(name).accelerator
        if acc.vendor == "nvidia":
            assert acc.fp8 == (acc.compute_capability >= (8, 9)), name
            # bf16 tensor cores start with Ampere; older GPUs carry no bf16 figure.
            assert (acc.bf16_tflops is None) == (acc.compute_capability < (8, 0)), name
        else:
            assert acc.vendor == "aws" and acc.compute_capability is None and not acc.fp8, name
        assert (acc.fp8_tflops is not None) == acc.fp8, name
        if acc.fp8:
            assert acc.fp8_tflops == pytest.approx(2 * acc.bf16_tflops, rel=0.02), name


def test_accelerated_entries_are_complete():
    for name in accelerated_types():
        inst = get_instance_type(name)
        assert inst.accelerators >= 1 and inst.accelerator.memory_gib > 0, name
        assert inst.vcpus > 0 and inst.memory_gib > 0, name
        assert inst.family == family(name), name


def test_prices_are_positive_for_priced_accelerated_types():
    priced = [n for n in accelerated_types() if n not in UNPRICED]
    assert len(priced) >= 50
    for name in priced:
        price = get_instance_type(name).usd_per_hour
        assert price is not None and price > 0, name
    for name in UNPRICED:
        assert get_instance_type(name).usd_per_hour is None, name
    p = {n: get_instance_type(n).usd_per_hour for n in ("ml.p4d.24xlarge", "ml.p5.48xlarge")}
    assert p["ml.p4d.24xlarge"] < p["ml.p5.48xlarge"]


def test_efa():
    # EFA with device RDMA (the hardware; what the toolkit sets is container/toolkit/torchrun_env.py's table).
    for name in ("ml.p4d.24xlarge", "ml.p4de.24xlarge", "ml.p5.48xlarge", "ml.p5e.48xlarge",
                 "ml.p5en.48xlarge", "ml.trn1.32xlarge", "ml.trn1n.32xlarge", "ml.trn2.48xlarge",
                 "ml.p6-b200.48xlarge", "ml.p6-b300.48xlarge", "ml.p6e-gb200.36xlarge"):
        assert get_instance_type(name).efa, name
    # No EFA, or first-generation EFA without device RDMA.
    for name in ("ml.g5.xlarge", "ml.g5.48xlarge", "ml.p3dn.24xlarge", "ml.g4dn.12xlarge",
                 "ml.trn1.2xlarge", "ml.m5.24xlarge", "local", "local_gpu"):
        assert not get_instance_type(name).efa, name


def test_cpu_types():
    m5 = get_instance_type("m5.xlarge")
    assert (m5.accelerators, m5.accelerator, m5.vcpus, m5.memory_gib) == (0, None, 4, 16)
    assert m5.family == "m5" and not m5.is_local and not m5.has_fp8
    c5 = get_instance_type("ml.c5.18xlarge")
    assert (c5.vcpus, c5.memory_gib) == (72, 144)
    assert get_instance_type("ml.t3.medium").vcpus == 2
    assert get_instance_type("ml.c5n.9xlarge").memory_gib == 96


def test_catalog_names():
    names = catalog.catalog_names()
    assert names == sorted(names) and len(names) == len(set(names))
    expected = {"local", "local_gpu", "ml.m5.xlarge", "ml.p5.48xlarge", "ml.trn1.32xlarge"}
    assert expected <= set(names)
    for name in names:
        assert normalize_instance_type(name) == name
        assert get_instance_type(name).name == name


def test_unknown_types(monkeypatch):
    monkeypatch.setattr(catalog, "botocore_training_instance_types",
                        lambda: frozenset({"ml.p9.48xlarge", "ml.m9i.2xlarge"}))
    assert get_instance_type("ml.p5.96xlarge") is None
    assert get_instance_type("ml.m5.3xlarge") is None
    assert get_instance_type("") is None
    # A new accelerated family is never mistaken for a CPU type ...
    assert get_instance_type("ml.p9.48xlarge") is None
    # ... while a new CPU family known to SageMaker is described generically.
    m9 = get_instance_type("m9i.2xlarge")
    assert (m9.name, m9.accelerators, m9.vcpus, m9.memory_gib) == ("ml.m9i.2xlarge", 0, 8, None)


def test_entries_are_immutable():
    with pytest.raises(dataclasses.FrozenInstanceError):
        get_instance_type("ml.p5.48xlarge").accelerators = 4


def test_botocore_reader_without_botocore(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert catalog.botocore_training_instance_types.__wrapped__() == frozenset()


