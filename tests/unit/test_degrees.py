"""One table of the parallel degrees (launcher.wire.training.degrees): every list of degrees derives from it,
so a new degree is one entry there (docs/architecture.md, "Where a new thing goes")."""

from __future__ import annotations

from dataclasses import replace

import pytest

from launcher.config import ModelParallelParameters, TrainingHyperparameters
from launcher.plan.configurations import _raw_settings
from launcher.plan.report import _SETTING_LABELS
from launcher.plan.search import fleet_layouts
from launcher.sdk.v3_configs import SMP
from launcher.wire.training import degrees
from launcher.wire.training.base import Strict
from launcher.wire.training.resume import PARALLEL_DEGREES


def test_the_distribution_has_every_degree_with_its_default_and_bound():
    fields = ModelParallelParameters.model_fields
    for d in degrees.DEGREES:
        assert fields[d.key].default == d.default, d.key
        with pytest.raises(ValueError):
            ModelParallelParameters(**{d.key: d.minimum - 1})


def test_sdk_v3_and_the_seed_script_take_the_degrees_the_table_gives_them():
    assert {k for k in SMP.model_fields if k.endswith("_degree")} == {d.key for d in degrees.DEGREES if d.smp_v3}
    script = {k for k in TrainingHyperparameters.model_fields if k.endswith("_degree")}
    assert script == {d.key for d in degrees.DEGREES if d.script_argument}
    assert script == {"hybrid_shard_degree", "context_parallel_degree", "tensor_parallel_degree"}  # the seed's


def test_the_planner_reports_and_resumes_every_degree():
    assert set(degrees.KEYS) <= set(_raw_settings({}))
    assert {k: v for k, v in _raw_settings({}).items() if k in degrees.KEYS} == {
        d.key: d.default for d in degrees.DEGREES}
    assert all(_SETTING_LABELS[d.key] == d.short for d in degrees.DEGREES)
    assert set(PARALLEL_DEGREES) == {d.key for d in degrees.DEGREES if d.resharded}


def test_the_search_sets_exactly_the_searched_degrees():
    layouts = list(fleet_layouts(8, 2, 64, 32))
    assert layouts and all(set(layout) == {d.key for d in degrees.DEGREES if d.searched} for layout in layouts)


def test_the_pipeline_alias_is_in_force_when_larger():
    pp = degrees.BY_KEY["pipeline_parallel_degree"]
    assert pp.value(ModelParallelParameters(partitions=4)) == 4 == ModelParallelParameters(partitions=4).pipeline_degree
    assert pp.raw_value({"partitions": 2}) == 2 and pp.raw_value({}) == 1


def test_a_new_degree_reaches_a_model_built_from_the_table(monkeypatch):
    # the control: the models are built from the table, not written out by hand
    extra = replace(degrees.BY_KEY["expert_parallel_degree"], key="sequence_parallel_degree", short="sp")
    monkeypatch.setattr(degrees, "DEGREES", (*degrees.DEGREES, extra))
    built = degrees.model_with_degrees("Probe", Strict)
    assert "sequence_parallel_degree" in built.model_fields
    assert built().sequence_parallel_degree == 1
