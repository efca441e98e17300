"""`smlaunch plan`, the planner in `submit` (refuse a predicted OOM unless --force) and
`PyTorch.plan()`/`fit()`. Expected figures come from arithmetic, not from the planner."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from launcher import PyTorch
from launcher.cli.app import main
from launcher.plan import PredictedOOMError
from tests.conftest import REGION, SEED_BUCKET
from tests.support.train_runs import ROOT

SEED = ROOT / "configs" / "seed"

LOGITS_GIB = 16384 * 128256 * 4 / 2**30  # one sequence's fp32 logits: the seed's OOM allocation
# The seed's own loss, on the whole fp32 logits (smlaunch's runtime chunks it by default, and fits)
WHOLE_LOGITS = ("--set", "hyperparameters.loss_chunk_tokens=0")


def run_cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(autouse=True)
def _no_network(no_network):
    """Planning never touches the network."""


def test_plan_says_the_seed_p4d_run_will_not_fit_and_why():
    result = run_cli("plan", SEED / "p4d-no-cp.yaml", *WHOLE_LOGITS)
    assert result.exit_code == 1, result.output
    out = " ".join(result.output.split())
    assert "does not fit" in out
    assert f'Tried to allocate {LOGITS_GIB:.2f} GiB' in out and "fp32 logits" in out
    assert "--set context_parallel_degree=2" in out and "fits" in out


def test_plan_of_the_seed_p4d_run_fits_with_the_chunked_loss():
    result = run_cli("plan", SEED / "p4d-no-cp.yaml")
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert "fits" in out and "does not fit" not in out and "Tried to allocate 7.83" not in out


def test_plan_of_the_cp8_run_fits():
    result = run_cli("plan", SEED / "p4d-cp8.yaml")
    assert result.exit_code == 0, result.output
    assert "fits" in result.output and "does not fit" not in result.output


def test_plan_json_has_the_documented_fields():
    rows = json.loads(run_cli("plan", SEED / "p4d-no-cp.yaml", *WHOLE_LOGITS, "--json", "--tokens", "1e9").output)
    assert len(rows) == 1
    row = rows[0]
    for key in ("fits", "peak_gib", "capacity_gib", "largest_allocation_gib", "tokens_per_s",
                "usd_per_billion_tokens", "hours_for_tokens", "usd_for_tokens"):
        assert key in row, key
    assert row["fits"] is False and row["capacity_gib"] == 40
    assert row["largest_allocation_gib"] == pytest.approx(LOGITS_GIB, abs=0.01)
    # cost arithmetic: $/B tokens from the job's tokens/s and the instance's hourly price
    assert row["usd_per_billion_tokens"] == pytest.approx(row["usd_per_hour"] / (row["tokens_per_s"] * 3600) * 1e9,
                                                          rel=1e-3)
    assert row["hours_for_tokens"] == pytest.approx(1e9 / row["tokens_per_s"] / 3600, rel=1e-3)


def test_sweep_reports_invalid_values_instead_of_failing():
    result = run_cli("plan", SEED / "p4d-no-cp.yaml", *WHOLE_LOGITS, "--sweep", "context_parallel_degree=1,3,8",
                     "--json")
    rows = json.loads(result.output)
    by_cp = {r["context_parallel_degree"]: r for r in rows}
    assert by_cp[1]["fits"] is False and by_cp[8]["fits"] is True
    assert by_cp[3]["valid"] is False and any("context_parallel_degree" in e for e in by_cp[3]["errors"])
    assert result.exit_code == 0  # some configuration fits


def test_auto_picks_the_cheapest_configuration_that_fits():
    # --auto with --sweep: the cheapest of the swept configurations (the search: test_plan_search.py)
    sweep = ("--sweep", "context_parallel_degree=1,2,4,8", "--sweep", "hyperparameters.activation_checkpointing=0,1")
    result = run_cli("plan", SEED / "p4d-no-cp.yaml", "--auto", *sweep, "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    picked = [r for r in rows if r["picked"]]
    assert len(picked) == 1 and picked[0]["fits"] is True
    fitting = [r for r in rows if r["fits"]]
    assert picked[0]["usd_per_billion_tokens"] == min(r["usd_per_billion_tokens"] for r in fitting)
    table = run_cli("plan", SEED / "p4d-no-cp.yaml", "--auto", *sweep)
    assert "picked: " in table.output and "--set context_parallel_degree=" in table.output


def test_plan_of_an_invalid_job_exits_2():
    result = run_cli("plan", SEED / "p4d-no-cp.yaml", "--set", "context_parallel_degree=3")
    assert result.exit_code == 2 and "context_parallel_degree" in result.output


def test_submit_refuses_a_predicted_oom_and_sends_nothing(aws):
    result = run_cli("submit", SEED / "p4d-no-cp.yaml", *WHOLE_LOGITS, "--no-wait", "--job-name", "oom")
    assert result.exit_code == 2
    assert "refused: the job is predicted to run out of accelerator memory" in result.output
    assert "context_parallel_degree=2" in result.output and "--force" in result.output
    assert aws.client("sagemaker").list_training_jobs()["TrainingJobSummaries"] == []
    assert "Contents" not in aws.client("s3").list_objects_v2(Bucket=SEED_BUCKET)

    forced = run_cli("submit", SEED / "p4d-no-cp.yaml", *WHOLE_LOGITS, "--no-wait", "--job-name", "oom", "--force")
    assert forced.exit_code == 0, forced.output
    assert "predicted out of memory (--force given)" in forced.output
    assert aws.client("sagemaker").describe_training_job(TrainingJobName="oom")["TrainingJobStatus"]


def test_estimator_plans_and_refuses(aws):
    est = PyTorch(entry_point="train.py", source_dir=str(SEED.parents[1] / "entrypoints"),
                  role="arn:aws:iam::111122223333:role/SageMakerExecutionRole", region=REGION,
                  instance_type="ml.p4d.24xlarge", output_path=f"s3://{SEED_BUCKET}/out",
                  hyperparameters={"max_context_width": 16384, "bf16": 1, "activation_checkpointing": 1,
                                   "hf_pretrained_model_name_or_dir": "meta-llama/Llama-3.1-8B",
                                   "vocab_size": 128256, "train_batch_size": 1, "loss_chunk_tokens": 0},
                  distribution={"torch_distributed": {"enabled": True},
                                "smdistributed": {"modelparallel": {"enabled": True, "parameters": {
                                    "hybrid_shard_degree": 8}}}})
    planned = est.plan()
    assert planned.fits is False
    assert planned.memory.largest_allocation.gib == pytest.approx(LOGITS_GIB, abs=0.01)
    with pytest.raises(PredictedOOMError, match="context_parallel_degree"):
        est.fit(wait=False)
    assert aws.client("sagemaker").list_training_jobs()["TrainingJobSummaries"] == []


def test_a_plan_in_a_notebook_has_a_short_repr_and_a_report_that_says_what_the_cli_says():
    """PyTorch(...).plan() displayed a repr of several KB in a notebook (issue 49): now one line, and
    .report() prints what `smlaunch plan` prints below its table, as the tuner's plan does."""
    from launcher.config import validate_job
    from launcher.config.jobfile import validate_job_file
    from launcher.plan import plan, sweep_job_file

    result = plan(validate_job_file(SEED / "p5-cp8-fp8.yaml"))
    assert repr(result) == (f"PlanResult(ml.p5.48xlarge x 1, cp=8 hsd=8 tp=1 ac=full batch=4: fits, peak "
                            f"{result.memory.peak_gib:.1f} of 80 GiB, {result.tokens_per_s:,.0f} tokens/s, "
                            f"${result.usd_per_billion_tokens:,.0f} per billion tokens)")
    cli = run_cli("plan", SEED / "p5-cp8-fp8.yaml")
    below_table = cli.output[cli.output.rindex("┘") + 1:]
    assert "goodput:" in below_table and "Predicted peak" in below_table
    report = result.report()
    assert " ".join(below_table.split()) in " ".join(report.split())
    assert report.startswith(f"models: {result.models}\nml.p5.48xlarge x 1, cp=8 hsd=8")
    # controls: a plan with nothing to plan, and an invalid one, say so in a line
    local = plan(validate_job({"entry_point": "train.py", "source_dir": str(ROOT / "entrypoints"),
                               "instance_type": "local", "hyperparameters": {"model_preset": "llama3-tiny"}}))
    assert repr(local) == "PlanResult(local x 1: nothing to plan)" and local.report().startswith("models: nothing: ")
    invalid = sweep_job_file(SEED / "p5-cp8-fp8.yaml", sweeps=["context_parallel_degree=3"])[0]
    assert repr(invalid).startswith("PlanResult(ml.p5.48xlarge x 1: invalid: context_parallel_degree = 3: ")
    assert invalid.report() == "cannot plan: " + "; ".join(invalid.errors)


def test_short_documents_plan_faster_than_long_ones_and_the_plan_says_why(tmp_path):
    """p5, llama3.1-8b, rows of 16K with document masking: the attention FLOPs come from the
    documents' lengths in the shards' headers. Documents of 1K tokens attend 1K per token (1/16
    of a causal row's), so the step is faster than with documents longer than a row; JSON Lines
    data (no lengths known) plans whole rows."""
    from container.data.indexed import write_shards

    def channel(name: str, length: int) -> str:
        docs = [[7] * length] * (2 * 16384 // length + 2)
        write_shards(docs, tmp_path / name, "train", vocab_size=128256,
                     tokenizer={"name": "t", "vocabulary_sha256": None})
        return str(tmp_path / name)

    def plan(*args):
        result = run_cli("plan", SEED / "p5-cp8-bf16.yaml", "--json", *args)
        assert result.exit_code in (0, 1), result.output
        return json.loads(result.output)[0]["throughput"]

    indexed = ("--set", "hyperparameters.dataset_type=indexed")
    short = plan(*indexed, "--data", channel("short", 1024))  # the job's channels are on S3: a local copy
    long = plan(*indexed, "--data", channel("long", 32768))
    rows = plan()
    assert short["tokens_per_s"] > long["tokens_per_s"]
    assert long["flops_per_token"] == pytest.approx(rows["flops_per_token"])  # a row of one document is causal
    assert short["flops_per_token"] < rows["flops_per_token"]
    # the attention term by hand: 6 L H d_head S at S = 1,024 instead of 16,384
    spec_term = 6 * 32 * 32 * 128
    assert rows["flops_per_token"] - short["flops_per_token"] == pytest.approx(spec_term * (16384 - 1024), rel=1e-6)
    text = run_cli("plan", SEED / "p5-cp8-bf16.yaml", *indexed, "--data", tmp_path / "short").output
    assert "attend 1,024 tokens per token on average with document masking, 6.2% of a causal row of 16,384" in \
        " ".join(text.split())


def _own_script_job(tmp_path, **hyperparameters):
    """The seed's p4d job without CP, run by a script of the user's own that uses SMP v2 (AWS's)."""
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / "train.py").write_text("import torch\nimport torch.sagemaker as tsm\n")
    job = tmp_path / "job.yaml"
    job.write_text(f"extends: {SEED / 'p4d-no-cp.yaml'}\nsource_dir: {src}\nimage_uri: null\n"
                   f"framework_version: '2.4.1'\npy_version: py311\nhyperparameters: {json.dumps(hyperparameters)}\n")
    return job


def test_a_script_of_ones_own_is_planned_as_awss_smp_program_and_the_plan_says_so(tmp_path):
    """AWS's script takes the whole fp32 logits into its loss: the seed's p4d run without CP does not
    fit (7.83 GiB, as it did on SageMaker), while smlaunch's runtime on the same job (its chunked loss)
    does; each plan's first line says which program it models."""
    own = run_cli("plan", _own_script_job(tmp_path))
    assert own.exit_code == 1, own.output
    assert own.output.startswith("models: AWS's SMP v2 reference program for your script")
    assert f"Tried to allocate {LOGITS_GIB:.2f} GiB" in " ".join(own.output.split())
    runtime = run_cli("plan", SEED / "p4d-no-cp.yaml")
    assert runtime.exit_code == 0 and runtime.output.startswith("models: smlaunch's runtime (entrypoints/train.py)")
    rows = json.loads(run_cli("plan", _own_script_job(tmp_path), "--json").output)
    assert rows[0]["models"].startswith("AWS's SMP v2 reference program") and rows[0]["fits"] is False


def test_a_compiled_run_is_planned_as_the_eager_one_and_the_plan_says_so():
    plans = {value: run_cli("plan", SEED / "p4d-no-cp.yaml", "--json", "--set", f"hyperparameters.compile={value}")
             for value in (0, 1)}
    rows = {value: json.loads(result.output)[0] for value, result in plans.items()}
    assert "compile=1 is priced as the eager run" in rows[1]["models"]
    assert "compile" not in rows[0]["models"]  # the control
    assert rows[1]["tokens_per_s"] == rows[0]["tokens_per_s"] and rows[1]["peak_gib"] == rows[0]["peak_gib"]


def test_an_smp_v1_script_says_its_sharded_data_parallel_degree_is_planned_as_the_sharding_group():
    """The seed's MiCS job (SMP v1) is planned with AWS's program too; its first line says how SMP v1's
    sharding is taken, and the figures follow it: sharded over 2 GPUs, each holds 4x the model state it
    holds sharded over 8 (tens of GiB more for a 7B model)."""
    model = ["--set", "hyperparameters.model_type=llama_v2", "--set", "hyperparameters.hidden_width=4096",
             "--set", "hyperparameters.num_layers=32", "--set", "hyperparameters.num_heads=32",
             "--set", "hyperparameters.intermediate_size=11008", "--set", "hyperparameters.vocab_size=32000",
             "--set", "hyperparameters.max_context_width=2048"]
    plans = {}
    for sdp in (2, 8):
        result = run_cli("plan", SEED / "mics-sdp2.yaml", *model, "--json",
                         "--set", f"sharded_data_parallel_degree={sdp}")
        assert result.exit_code in (0, 1), result.output
        plans[sdp] = json.loads(result.output)[0]
        assert plans[sdp]["models"].startswith("AWS's SMP v2 reference program for your script")
        assert plans[sdp]["models"].endswith(f"sharded over groups of sharded_data_parallel_degree = {sdp} GPUs")
        assert plans[sdp]["sharding_group"] == sdp
    assert plans[2]["peak_gib"] - plans[8]["peak_gib"] > 20  # the control: the degree counts


def test_the_configuration_of_an_smp_v1_job_names_its_sharding_group():
    """The plan's configuration column said hsd=0 (shard over every rank) for the MiCS job, which
    shards over sharded_data_parallel_degree = 2 (issue 49); the seed's p4d job is the control."""
    from launcher.config.jobfile import validate_job_file
    from launcher.plan import describe, plan

    model = ["hyperparameters.model_type=llama_v2", "hyperparameters.hidden_width=4096",
             "hyperparameters.num_layers=32", "hyperparameters.num_heads=32", "hyperparameters.intermediate_size=11008",
             "hyperparameters.vocab_size=32000", "hyperparameters.max_context_width=2048"]
    mics = plan(validate_job_file(SEED / "mics-sdp2.yaml", model))
    assert describe(mics) == "cp=1 sdp=2 tp=1 ac=off batch=1"
    assert mics.to_dict()["sharded_data_parallel_degree"] == 2 == mics.to_dict()["sharding_group"]
    assert describe(plan(validate_job_file(SEED / "p4d-no-cp.yaml"))) == "cp=1 hsd=8 tp=1 ac=full batch=1"


def test_a_script_that_does_not_say_its_model_has_nothing_to_plan_and_that_is_no_error(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("import torch\n")
    job = tmp_path / "job.yaml"
    job.write_text(f"entry_point: train.py\nsource_dir: {src}\ninstance_type: ml.p5.48xlarge\nframework_version: "
                   "'2.8.0'\npy_version: py312\nrole: arn:aws:iam::111122223333:role/x\nhyperparameters: {epochs: 1}\n")
    result = run_cli("plan", job)
    assert result.exit_code == 0
    assert result.output.startswith("models: nothing: this script does not say its model")
    assert "model_type" in result.output and "hf_pretrained_model_name_or_dir" in result.output


def test_a_local_job_says_why_there_is_nothing_to_plan(tmp_path):
    from launcher import ModelTrainer
    from launcher.model_trainer import Compute, SourceCode

    trainer = ModelTrainer(source_code=SourceCode(source_dir=str(ROOT / "entrypoints"), entry_script="train.py"),
                           compute=Compute(instance_type="local", instance_count=1),
                           hyperparameters={"model_preset": "llama3-tiny", "max_context_width": 64})
    result = trainer.plan()
    assert result.nothing_to_plan.startswith("a local job runs on this machine")
    assert "instance_type=ml.p5.48xlarge" in result.nothing_to_plan and result.memory is None


def test_the_hint_for_a_local_job_plans_it(tmp_path):
    """The hint `--set instance_type=ml.p5.48xlarge` led to 3 validation errors for a job with local
    channels and output_path (issue 49, configs/local/demo.yaml): the overrides it names now plan it."""
    import re

    for name in ("train", "validation"):
        (tmp_path / "data" / name).mkdir(parents=True)
        (tmp_path / "data" / name / f"{name}.jsonl").write_text(json.dumps({"input_ids": list(range(64))}) + "\n")
    job = tmp_path / "job.yaml"
    job.write_text(f"entry_point: train.py\nsource_dir: {ROOT / 'entrypoints'}\ninstance_type: local\n"
                   "output_path: artifacts\ninputs: {train: data/train, validation: data/validation}\n"
                   "hyperparameters: {model_preset: llama3-tiny, dataset_type: jsonl, max_context_width: 64, "
                   "bf16: 1}\n")
    local = run_cli("plan", job)
    assert local.exit_code == 0 and local.output.startswith("models: nothing: a local job runs on this machine")
    hinted = re.findall(r"--set (\S+)", " ".join(local.output.split()))
    assert hinted == ["instance_type=ml.p5.48xlarge", "backend=slurm"]
    planned = run_cli("plan", job, *(arg for s in hinted for arg in ("--set", s)))
    assert planned.exit_code == 0, planned.output
    assert "Predicted peak" in planned.output and "ml.p5.48xlarge" in planned.output
    # control: as a SageMaker job its local paths are still refused, as SageMaker would refuse them
    sagemaker = run_cli("plan", job, "--set", "instance_type=ml.p5.48xlarge")
    assert sagemaker.exit_code == 2 and "SageMaker reads channels from S3" in sagemaker.output


@pytest.mark.parametrize("tokens", ["nan", "-5", "inf", "0", "lots"])
def test_tokens_must_be_a_positive_finite_number(tokens: str) -> None:
    """Issue 31, item 18: float() took 'nan' and '-5', and the plan printed hours and dollars of them."""
    result = CliRunner().invoke(main, ["plan", str(SEED / "p4d-cp8.yaml"), "--tokens", tokens])
    assert result.exit_code == 2, result.output
    assert f"--tokens = {tokens}: not a number of tokens above 0; give a positive number, e.g. 1e9" in result.output
    assert "configuration" not in result.output  # nothing planned


def test_a_positive_token_count_is_planned() -> None:
    result = CliRunner().invoke(main, ["plan", str(SEED / "p4d-cp8.yaml"), "--tokens", "1e9"])
    assert result.exit_code == 0 and "1,000,000,000 tokens:" in result.output, result.output
