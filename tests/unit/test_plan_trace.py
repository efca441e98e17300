"""`smlaunch plan --trace`'s client side (launcher.plan.trace, trace_report, wire/trace_record): the
request, which ranks are traced, the comparison with the plan, the words, the JSON and the errors.
The runtime's answer is given as data here (tests/unit starts no process); the runtime itself is
tested end to end in tests/integration/test_plan_trace.py."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from launcher.cli.app import main
from launcher.config.jobfile import validate_job_file
from launcher.plan import trace as trace_module
from launcher.plan.trace import Trace, TraceError, as_traced, request, traced_ranks
from launcher.plan.trace_report import differences, trace_dict, trace_lines
from launcher.wire.trace_record import TraceRequest, read_result, result_line, spec_from_dict, spec_to_dict
from launcher.wire.training.layout import ParallelLayout
from launcher.wire.training.models import PRESETS
from tests.conftest import SEED_BUCKET
from tests.support.train_runs import ROOT

SEED_P5 = ROOT / "configs" / "seed" / "p5-cp8-bf16.yaml"
GIB = 2**30
PLANNED = {"parameter_bytes": 4 * GIB, "gradient_bytes": 4 * GIB, "optimizer_bytes": 8 * GIB,
           "peak_bytes": 20 * GIB}


def rank_result(rank: int = 0, **figures) -> dict:
    """What `python -m container trace` prints for a rank (launcher.wire.trace_record's fields)."""
    return {"rank": rank, "mesh": {"pp": 1, "dp_replicate": 16, "dp_shard": 1, "cp": 8, "tp": 1},
            **PLANNED, "peak_kinds": {"Total": PLANNED["peak_bytes"]}, **figures,
            "peak_at": {"phase": "backward", "module": "layers.1.feed_forward"}, "seconds": 59.1,
            "collectives": [{"kind": "_allgather_base", "group": "dp_shard_cp", "group_size": 8, "count": 65,
                             "bytes": 3 * GIB}]}


def a_trace(**figures) -> Trace:
    return Trace(world_size=128, seconds=61.0, ranks=[rank_result(**figures)], planned=dict(PLANNED),
                 traced_as="cp_comm_type all_gather: ...")


def test_a_request_and_a_model_cross_as_json_unchanged():
    spec = PRESETS["llama3.1-8b"]  # tuples (rope_scaling, eos_token_id) that JSON turns into lists
    assert spec_from_dict(json.loads(json.dumps(spec_to_dict(spec)))) == spec
    job = validate_job_file(SEED_P5, ["instance_count=16"])
    req = request(job, 0)
    back = TraceRequest.from_json(req.to_json())
    assert back == req and back.spec() == job.model and back.world_size == 128
    # only the fields the job set: a default the client never set must not become "set" (sm_activation_offloading)
    assert set(req.mp_parameters) == {"hybrid_shard_degree", "context_parallel_degree",
                                      "delayed_parameter_initialization"}
    with pytest.raises(ValueError, match="rank"):
        TraceRequest.from_json('{"world_size": 8}')


def test_the_result_is_the_last_json_line_of_the_rank_output():
    result = rank_result()
    assert read_result("torch says something\n" + result_line(result) + "\n") == result
    assert read_result("Traceback ...\nRuntimeError: boom\n") is None


def test_rank_0_is_traced_and_the_last_pipeline_stage_when_there_is_one():
    assert traced_ranks(ParallelLayout(world=128, dp_replicate=16, dp_shard=1, cp=8, tp=1)) == [0]
    # pp is the mesh's outermost dimension: the last of 4 stages of 32 ranks starts at rank 24
    assert traced_ranks(ParallelLayout(world=32, dp_replicate=1, dp_shard=8, cp=1, tp=1, pp=4)) == [0, 24]


def test_context_parallelism_is_traced_and_planned_as_the_all_gather_path_it_runs_on_cpu():
    job = validate_job_file(SEED_P5, ["instance_count=16"])
    traced, why = as_traced(job)
    assert job.settings.cp_comm_type == "p2p" and traced.settings.cp_comm_type == "all_gather"
    assert "Transformer Engine" in why
    control = validate_job_file(SEED_P5, ["instance_count=16", "distribution.smdistributed.modelparallel."
                                          "parameters.context_parallel_degree=1"])
    assert as_traced(control) == (control, None)


def test_a_difference_over_10_percent_is_flagged_with_its_explanation():
    assert differences(rank_result(), PLANNED) == []
    within = rank_result(peak_bytes=round(PLANNED["peak_bytes"] / 1.09))  # planned is 9% over the trace
    assert differences(within, PLANNED) == []
    over = rank_result(peak_bytes=round(PLANNED["peak_bytes"] / 1.25), parameter_bytes=5 * GIB)
    flagged = {d["figure"]: d for d in differences(over, PLANNED)}
    assert set(flagged) == {"peak_bytes", "parameter_bytes"}
    assert flagged["peak_bytes"]["planned_vs_traced"] == pytest.approx(0.25, abs=1e-4)
    assert flagged["parameter_bytes"]["planned_vs_traced"] == pytest.approx(-0.2)
    assert "stream" in flagged["peak_bytes"]["why"] and "padding" in flagged["parameter_bytes"]["why"]


def test_the_words_put_each_traced_figure_beside_the_planned_one():
    lines = trace_lines(a_trace(peak_bytes=16 * GIB))
    text = "\n".join(lines)
    assert lines[0].startswith("trace: rank 0 of 128 (dp_replicate 16 x cp 8)")
    assert "cp_comm_type all_gather" in lines[0]
    peak = next(line for line in lines if line.strip().startswith("peak of live tensors"))
    assert peak.split()[4:7] == ["16.00", "20.00", "+25%"]
    assert "in the backward, in layers.1.feed_forward" in text
    assert "! peak of live tensors differs by +25%" in text
    assert "_allgather_base over dp_shard_cp (8 ranks) x65, 3.00 GiB" in text
    tiny = Trace(world_size=8, seconds=1.0, ranks=[rank_result(peak_bytes=3 * 2**20)], planned=dict(PLANNED))
    assert "traced MiB" in trace_lines(tiny)[1]  # a tiny model's figures would all read 0.00 GiB
    assert trace_lines(Trace(world_size=8, seconds=0.1, not_traced="FP8's modules need CUDA kernels")) == [
        "trace: not traced: FP8's modules need CUDA kernels"]


def test_the_json_has_the_documented_fields():
    out = trace_dict(a_trace())
    assert {"world_size", "seconds", "ranks"} <= set(out)
    rank = out["ranks"][0]
    assert {"rank", "parameter_bytes", "gradient_bytes", "optimizer_bytes", "peak_bytes", "planned_peak_bytes",
            "peak_at", "collectives"} <= set(rank)
    assert rank["planned_peak_bytes"] == 20 * GIB and rank["differences"] == []
    untraced = trace_dict(Trace(world_size=8, seconds=0.1, not_traced="why"))
    assert untraced["not_traced"] == "why" and "ranks" not in untraced


def use_trace(monkeypatch, run_trace) -> None:
    """The runtime's answer as data: `plan --trace` and submit's check (launcher.plan.fits) call this."""
    from launcher.plan import fits

    monkeypatch.setattr(trace_module, "run_trace", run_trace)
    monkeypatch.setattr(fits, "run_trace", run_trace)


def run_cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_plan_trace_json_carries_the_trace_in_the_configuration(monkeypatch):
    asked = []
    use_trace(monkeypatch, lambda job: asked.append(job.layout.world) or a_trace())
    result = run_cli("plan", SEED_P5, "--set", "instance_count=16", "--trace", "--json")
    assert result.exit_code == 0, result.output
    assert asked == [128]
    (row,) = json.loads(result.output)
    assert row["trace"]["ranks"][0]["peak_bytes"] == 20 * GIB
    control = run_cli("plan", SEED_P5, "--set", "instance_count=16", "--json")
    assert "trace" not in json.loads(control.output)[0] and asked == [128]


def test_a_failed_trace_exits_2_with_where_and_no_traceback(monkeypatch):
    def fails(job):
        raise TraceError("rank 0 of 128: the step's forward, in layers.0.attention (its parameters: wq.weight "
                         "(4096, 4096)): RuntimeError: shape mismatch")

    use_trace(monkeypatch, fails)
    result = run_cli("plan", SEED_P5, "--set", "instance_count=16", "--trace")
    assert result.exit_code == 2
    assert "rank 0 of 128" in result.output and "layers.0.attention" in result.output
    assert "Traceback" not in result.output


def test_without_torch_trace_exits_2_naming_what_to_install(monkeypatch):
    found = trace_module.importlib.util.find_spec
    monkeypatch.setattr(trace_module.importlib.util, "find_spec",
                        lambda name: None if name == "torch" else found(name))
    result = run_cli("plan", SEED_P5, "--set", "instance_count=16", "--trace")
    assert result.exit_code == 2
    assert "pip install 'smlaunch[train]'" in result.output and "Traceback" not in result.output


def test_trace_refuses_a_sweep_it_would_not_pick_from():
    result = run_cli("plan", SEED_P5, "--trace", "--sweep", "context_parallel_degree=1,2")
    assert result.exit_code == 2 and "--trace traces one configuration" in result.output and "--auto" in result.output


def test_auto_trace_traces_the_cheapest_configuration_of_the_search(monkeypatch):
    traced = []
    use_trace(monkeypatch, lambda job: traced.append(job) or a_trace())
    search = ("plan", SEED_P5, "--auto", "--instance-types", "ml.p5.48xlarge", "--max-instances", "2")
    result = run_cli(*search, "--trace", "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)["pareto"]
    cheapest = next(r for r in rows if r["cheapest"])
    assert cheapest["trace"]["ranks"][0]["peak_bytes"] == 20 * GIB
    assert [r for r in rows if "trace" in r] == [cheapest]  # the cheapest row only
    (job,) = traced
    assert job.layout.world == 8 * cheapest["instance_count"]  # the cheapest's job, not the file's
    words = run_cli(*search, "--trace")
    assert "traced: the cheapest" in words.output and "peak of live tensors" in words.output
    control = run_cli(*search, "--json")  # without --trace: no trace anywhere, nothing traced again
    assert all("trace" not in r for r in json.loads(control.output)["pareto"]) and len(traced) == 2


def test_auto_with_a_sweep_traces_the_configuration_it_picks(monkeypatch):
    traced = []
    use_trace(monkeypatch, lambda job: traced.append(job.layout.cp) or a_trace())
    result = run_cli("plan", SEED_P5, "--auto", "--sweep", "context_parallel_degree=4,8", "--trace", "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    (picked,) = [r for r in rows if r["picked"]]
    assert "trace" in picked and all("trace" not in r for r in rows if not r["picked"])
    assert traced == [picked["context_parallel_degree"]]


# --- submit and fit() with the trace asked for (trace: true, submit --trace) -------------------------------


def test_submit_trace_refuses_a_failed_trace_and_sends_nothing(aws, monkeypatch):
    def fails(job):
        raise TraceError("rank 0 of 128: parallelizing the model (...): ValueError: tp must divide the heads")

    use_trace(monkeypatch, fails)
    result = run_cli("submit", SEED_P5, "--set", "instance_count=16", "--no-wait", "--job-name", "traced", "--trace")
    assert result.exit_code == 2
    assert "refused: the trace failed: rank 0 of 128: parallelizing the model" in result.output
    assert "Traceback" not in result.output
    assert aws.client("sagemaker").list_training_jobs()["TrainingJobSummaries"] == []
    assert "Contents" not in aws.client("s3").list_objects_v2(Bucket=SEED_BUCKET)


def test_submit_with_trace_true_refuses_a_traced_peak_that_does_not_fit(aws, monkeypatch):
    # 76 GiB of live tensors + 5% allocator reserve + 1 GiB of CUDA context and NCCL > 76 GiB usable of 80
    use_trace(monkeypatch, lambda job: a_trace(peak_bytes=76 * GIB))
    refused = run_cli("submit", SEED_P5, "--set", "instance_count=16", "--set", "trace=true", "--no-wait",
                      "--job-name", "traced")
    assert refused.exit_code == 2
    assert "rank 0 peaks at 80.80 GiB" in refused.output and "76.00 GiB of 80 are usable" in refused.output
    assert aws.client("sagemaker").list_training_jobs()["TrainingJobSummaries"] == []
    use_trace(monkeypatch, lambda job: a_trace())  # the control: 20 GiB fits
    sent = run_cli("submit", SEED_P5, "--set", "instance_count=16", "--set", "trace=true", "--no-wait",
                   "--job-name", "traced")
    assert sent.exit_code == 0, sent.output
    assert aws.client("sagemaker").describe_training_job(TrainingJobName="traced")["TrainingJobStatus"]


def test_a_job_asking_for_a_trace_it_cannot_have_is_refused_not_sent_untraced(aws, monkeypatch):
    untraced = Trace(world_size=8, seconds=0.1, not_traced="FP8's modules (Transformer Engine, torchao) need CUDA")
    use_trace(monkeypatch, lambda job: untraced)
    result = run_cli("submit", ROOT / "configs" / "seed" / "p5-cp8-fp8.yaml", "--no-wait", "--trace")
    assert result.exit_code == 2 and "cannot be traced: FP8's modules" in result.output
    assert "trace: false" in result.output
    assert aws.client("sagemaker").list_training_jobs()["TrainingJobSummaries"] == []


def test_fit_with_trace_refuses_before_submitting(aws, monkeypatch):
    from launcher import PyTorch
    from launcher.plan import TraceRefusal

    use_trace(monkeypatch, lambda job: a_trace(peak_bytes=90 * GIB))
    job = validate_job_file(SEED_P5, ["instance_count=16"])
    config = job.config.model_dump(exclude_unset=True, exclude={"extends"})
    est = PyTorch(**{**config, "trace": True})
    with pytest.raises(TraceRefusal, match="does not fit"):
        est.fit(wait=False)
    assert aws.client("sagemaker").list_training_jobs()["TrainingJobSummaries"] == []
