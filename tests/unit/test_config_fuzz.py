"""Fuzzing: whatever a user writes, validation answers with a ConfigError or a valid job."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from launcher.config import ConfigError, ModelParallelParameters, ParallelLayout, validate_job

MP_KEYS = list(ModelParallelParameters.model_fields) + ["context_paralel_degree", "junk"]
scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 70), st.floats(allow_nan=True),
                    st.text(max_size=6), st.sampled_from(["true", "8", "1e3", "auto", "nccl"]))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.text(max_size=5), inner, max_size=3)),
                      max_leaves=6)

parameters = st.dictionaries(st.sampled_from(MP_KEYS), st.one_of(st.integers(0, 16), values), max_size=6)
distribution = st.one_of(
    values,
    st.fixed_dictionaries({}, optional={
        "torch_distributed": st.one_of(values, st.fixed_dictionaries({"enabled": st.one_of(st.booleans(), values)})),
        "smdistributed": st.one_of(values, st.fixed_dictionaries({}, optional={
            "modelparallel": st.one_of(values, st.fixed_dictionaries(
                {"enabled": st.booleans()}, optional={"parameters": st.one_of(parameters, values)})),
            "dataparallel": st.fixed_dictionaries({"enabled": st.one_of(st.booleans(), values)}),
        })),
        "mpi": st.fixed_dictionaries({}, optional={"enabled": st.booleans(),
                                                   "processes_per_host": st.integers(-1, 16)}),
        "pytorchddp": values,
    }),
)
hyperparameters = st.dictionaries(
    st.sampled_from(["fp8", "bf16", "fp16", "max_context_width", "activation_checkpointing", "fp8_backend",
                     "fp8_recipe", "sharding_strategy", "model_preset", "num_heads", "delayed_param", "x"]),
    st.one_of(st.integers(-2, 40000), values), max_size=5)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dist=distribution, hp=st.one_of(hyperparameters, values),
       instance=st.sampled_from(["ml.p4d.24xlarge", "ml.p5.48xlarge", "local", "local_gpu", "ml.c5.xlarge",
                                 "p5.48xlarge", "ml.bogus", 7]),
       count=st.one_of(st.integers(-1, 5), values), pph=st.one_of(st.none(), st.integers(-1, 9)))
def test_only_config_errors_escape(tmp_path_factory, dist, hp, instance, count, pph):
    job = {"entry_point": "train.py", "instance_type": instance, "instance_count": count,
           "distribution": dist, "hyperparameters": hp, "processes_per_host": pph}
    try:
        result = validate_job(job, base_dir=tmp_path_factory.getbasetemp())
    except ConfigError as exc:
        assert exc.issues, "a ConfigError must carry at least one error"
        for issue in exc.issues:
            assert issue.path and issue.problem
        return
    # Valid results are self-consistent: the layout multiplies back to the world size.
    if result.layout is not None:
        lay = result.layout
        assert lay.dp_replicate * lay.dp_shard * lay.cp * lay.tp == lay.world


@settings(max_examples=300, deadline=None)
@given(hosts=st.integers(1, 8), gpus=st.sampled_from([1, 2, 4, 8]), tp=st.sampled_from([1, 2, 4, 8]),
       cp=st.sampled_from([1, 2, 4, 8]), hsd=st.sampled_from([0, 1, 2, 4, 8, 16]))
def test_every_accepted_layout_tiles_the_world(tmp_path_factory, hosts, gpus, tp, cp, hsd):
    """Accepted degrees give a mesh whose product is the world, with cp inside the sharding group."""
    base = tmp_path_factory.getbasetemp()
    (base / "train.py").touch()
    job = {"entry_point": "train.py", "instance_type": "local", "instance_count": hosts,
           "processes_per_host": gpus,
           "distribution": {"torch_distributed": {"enabled": True}, "smdistributed": {"modelparallel": {
               "enabled": True, "parameters": {"tensor_parallel_degree": tp, "context_parallel_degree": cp,
                                               "hybrid_shard_degree": hsd}}}}}
    world = hosts * gpus
    try:
        result = validate_job(job, base_dir=base)
    except ConfigError:
        # Rejected only if SMP's arithmetic really fails.
        group = hsd or world // tp if world % tp == 0 else None
        assert (world % tp or world % cp or (hsd and (hsd > world // tp or world % (hsd * tp)))
                or (group and group % cp))
        return
    lay = result.layout
    assert lay == ParallelLayout.from_parameters(result.config.distribution.parameters, world)
    assert lay.dp_replicate * lay.dp_shard * lay.cp * lay.tp == world
    assert lay.sharding_group == (hsd or world // tp)
    assert lay.data_parallel == world // (tp * cp)
