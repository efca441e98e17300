from __future__ import annotations

from pathlib import Path

import pytest

from launcher.config.jobfile import apply_overrides, deep_merge, load_job_file, validate_job_file
from launcher.wire.training.issues import ConfigError

MP = ("distribution", "smdistributed", "modelparallel", "parameters")


def write(path, text):
    path.write_text(text)
    return path


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text("")
    write(tmp_path / "base.yaml", """
entry_point: train.py
source_dir: code
instance_type: local
processes_per_host: 2
hyperparameters: {bf16: 0, lr: 0.001, seq: 1}
distribution:
  torch_distributed: {enabled: true}
  smdistributed: {modelparallel: {enabled: true, parameters: {hybrid_shard_degree: 2}}}
""")
    (tmp_path / "runs").mkdir()
    write(tmp_path / "runs" / "cp.yaml", """
extends: ../base.yaml
hyperparameters: {lr: 0.0002}
distribution:
  smdistributed: {modelparallel: {parameters: {context_parallel_degree: 2}}}
""")
    return tmp_path


def test_extends_merges_mappings_and_resolves_paths_per_file(tree):
    data, base = load_job_file(tree / "runs" / "cp.yaml")
    assert data["hyperparameters"] == {"bf16": 0, "lr": 0.0002, "seq": 1}
    assert data["distribution"]["smdistributed"]["modelparallel"]["parameters"] == {
        "hybrid_shard_degree": 2, "context_parallel_degree": 2}
    # source_dir is relative to base.yaml, where it was written, not to runs/cp.yaml
    assert data["source_dir"] == str((tree / "code").resolve())
    assert base == (tree / "runs").resolve()
    job = validate_job_file(tree / "runs" / "cp.yaml")
    assert job.layout.mesh_shape == (1, 1, 1, 2, 1)  # (pp, dp_replicate, dp_shard, cp, tp)


def test_every_path_of_a_base_file_is_relative_to_it_from_any_folder(tmp_path):
    """`extends` resolved inputs and output_path against the extending file (issue 49: a job that
    extends configs/local/demo.yaml from another folder lost its channels and wrote its artifacts
    outside the repository); every path field is now relative to the file that sets it. Controls:
    the extending file's own paths are relative to it, S3 URIs and absolute paths stay as written."""
    base_dir, run_dir = tmp_path / "project" / "configs", tmp_path / "elsewhere"
    for d in ("project/data/train", "project/data/validation", "project/scripts", "elsewhere/mine"):
        (tmp_path / d).mkdir(parents=True)
    (tmp_path / "project" / "scripts" / "train.py").write_text("")
    base_dir.mkdir()
    run_dir.mkdir(exist_ok=True)
    write(base_dir / "base.yaml", """
entry_point: ../scripts/train.py
instance_type: local
output_path: ../artifacts
checkpoint_local_path: ../checkpoints
dependencies: [../scripts, /opt/lib]
inputs: {train: ../data/train, validation: {s3_data: "file://../data/validation"}, remote: "s3://bucket/x"}
slurm: {python: ../venv/bin/python}
kubernetes: {kubeconfig: ../kube.yaml, storage: {pvc: data, client_path: ../mnt}}
hyperparameters: {model_preset: llama3-tiny, tokenizer: tok}
""")
    write(run_dir / "job.yaml", f"extends: {base_dir / 'base.yaml'}\nbase_job_name: mine\n")
    data, base = load_job_file(run_dir / "job.yaml")
    project = (tmp_path / "project").resolve()
    assert base == run_dir.resolve()
    assert data["entry_point"] == str(project / "scripts" / "train.py")
    assert data["output_path"] == str(project / "artifacts")
    assert data["checkpoint_local_path"] == str(project / "checkpoints")
    assert data["dependencies"] == [str(project / "scripts"), "/opt/lib"]
    assert data["inputs"] == {"train": str(project / "data" / "train"),
                              "validation": {"s3_data": f"file://{project / 'data' / 'validation'}"},
                              "remote": "s3://bucket/x"}
    assert data["slurm"]["python"] == str(project / "venv" / "bin" / "python")
    assert data["kubernetes"] == {"kubeconfig": str(project / "kube.yaml"),
                                  "storage": {"pvc": "data", "client_path": str(project / "mnt")}}
    assert data["hyperparameters"]["tokenizer"] == "tok"  # the script's, relative to its code (not a job path)
    # the extending file's own paths: relative to it
    write(run_dir / "own.yaml", f"extends: {base_dir / 'base.yaml'}\ninputs: {{train: mine}}\noutput_path: out\n")
    own, _ = load_job_file(run_dir / "own.yaml")
    assert own["inputs"]["train"] == str(run_dir.resolve() / "mine")  # mappings merge: the base's other channels stay
    assert own["output_path"] == str(run_dir.resolve() / "out")


def test_a_job_extending_a_local_job_from_another_folder_validates_and_writes_where_the_base_says(tmp_path):
    base_dir, run_dir = tmp_path / "project" / "configs", tmp_path / "elsewhere"
    for name in ("train", "validation"):
        (tmp_path / "project" / "data" / name).mkdir(parents=True)
        (tmp_path / "project" / "data" / name / f"{name}.jsonl").write_text('{"input_ids": [1, 2, 3, 4]}\n')
    base_dir.mkdir()
    run_dir.mkdir()
    entrypoints = Path(__file__).resolve().parents[2] / "entrypoints"
    write(base_dir / "demo.yaml", f"""
entry_point: train.py
source_dir: {entrypoints}
instance_type: local
output_path: ../artifacts
inputs: {{train: ../data/train, validation: ../data/validation}}
hyperparameters: {{model_preset: llama3-tiny, dataset_type: jsonl, max_context_width: 4}}
""")
    write(run_dir / "job.yaml", f"extends: {base_dir / 'demo.yaml'}\nbase_job_name: elsewhere\n")
    job = validate_job_file(run_dir / "job.yaml")
    project = (tmp_path / "project").resolve()
    assert job.config.output_path == str(project / "artifacts")
    assert {n: c.s3_data for n, c in job.config.channels().items()} == {
        "train": str(project / "data" / "train"), "validation": str(project / "data" / "validation")}


def test_entry_point_without_source_dir_is_relative_to_its_file_and_with_one_to_source_dir(tmp_path):
    (tmp_path / "base").mkdir()
    (tmp_path / "run").mkdir()
    write(tmp_path / "base" / "base.yaml", "entry_point: train.py\ninstance_type: local\n")
    write(tmp_path / "run" / "plain.yaml", "extends: ../base/base.yaml\n")
    assert load_job_file(tmp_path / "run" / "plain.yaml")[0]["entry_point"] == str(
        (tmp_path / "base" / "train.py").resolve())
    # control: with a source_dir (set by the extending file here) entry_point names a file inside it
    write(tmp_path / "run" / "code.yaml", "extends: ../base/base.yaml\nsource_dir: src\n")
    assert load_job_file(tmp_path / "run" / "code.yaml")[0]["entry_point"] == "train.py"
    # control: --set entry_point is the caller's, relative to the job file given
    data, _ = load_job_file(tmp_path / "run" / "plain.yaml", ["entry_point=other.py"])
    assert data["entry_point"] == "other.py"


def test_overrides_dotted_and_short_mp_keys(tree):
    job = validate_job_file(tree / "runs" / "cp.yaml",
                            ["hyperparameters.lr=0.5", "context_parallel_degree=1", "instance_count=2"])
    assert job.config.hyperparameters.lr == 0.5
    assert job.config.distribution.parameters.context_parallel_degree == 1
    assert job.layout.world == 4


def test_override_creates_missing_sections():
    data = {"entry_point": "x.py"}
    apply_overrides(data, ["tensor_parallel_degree=2", "hyperparameters.fp8=true"])
    mp = data["distribution"]["smdistributed"]["modelparallel"]
    assert mp == {"enabled": True, "parameters": {"tensor_parallel_degree": 2}}
    assert data["hyperparameters"] == {"fp8": True}


@pytest.mark.parametrize("item,needle", [("novalue", "KEY=VALUE"),
                                         ("context_paralel_degree=2", "context_parallel_degree")])
def test_bad_overrides_name_the_option(item, needle):
    with pytest.raises(ConfigError) as info:
        apply_overrides({}, [item])
    assert info.value.issues[0].path == "--set" and needle in str(info.value)


def test_yaml_error_names_file_and_line(tmp_path):
    bad = write(tmp_path / "bad.yaml", "entry_point: train.py\ninstance_type: [oops\n")
    with pytest.raises(ConfigError) as info:
        load_job_file(bad)
    assert str(bad) in str(info.value) and "line 3" in str(info.value)


def test_missing_file_and_cycle(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_job_file(tmp_path / "none.yaml")
    write(tmp_path / "a.yaml", "extends: b.yaml\n")
    write(tmp_path / "b.yaml", "extends: a.yaml\n")
    with pytest.raises(ConfigError, match="circular"):
        load_job_file(tmp_path / "a.yaml")


def test_top_level_must_be_mapping(tmp_path):
    with pytest.raises(ConfigError, match="mapping"):
        load_job_file(write(tmp_path / "l.yaml", "- a\n- b\n"))


def test_deep_merge_does_not_mutate():
    base = {"a": {"b": 1, "c": [1]}}
    out = deep_merge(base, {"a": {"c": [2]}})
    assert out == {"a": {"b": 1, "c": [2]}} and base == {"a": {"b": 1, "c": [1]}}


def test_extends_names_yaml_job_files_only_and_never_shows_a_base_files_values(tmp_path):
    """Issue 31, item 12: `extends: /etc/shadow` (or any file) printed its lines as unknown keys."""
    from click.testing import CliRunner

    from launcher.cli.app import main

    (tmp_path / "notes.txt").write_text("dbuser: hunter2value\n")
    (tmp_path / "notes.yaml").write_text("dbuser: hunter2value\n")
    (tmp_path / "base.yaml").write_text("instance_type: local\n")  # control: a job file
    (tmp_path / "train.py").write_text("print(1)\n")
    outputs = {}
    for base in ("notes.txt", "/etc/shadow", "notes.yaml", "base.yaml"):
        (tmp_path / "job.yaml").write_text(f"extends: {base}\nentry_point: train.py\nframework_version: '2.8.0'\n"
                                           "py_version: py312\n")
        result = CliRunner().invoke(main, ["validate", str(tmp_path / "job.yaml")])
        outputs[base] = (result.exit_code, result.output)
    assert outputs["base.yaml"][0] == 0, outputs["base.yaml"]
    for base in ("notes.txt", "/etc/shadow"):
        assert outputs[base][0] == 2 and "is not a YAML job file (.yaml or .yml)" in outputs[base][1]
    assert outputs["notes.yaml"][0] == 2
    said = "is not a job file: 1 key(s) are not job fields ('dbuser'); its values are not shown"
    assert said in outputs["notes.yaml"][1]
    assert not any("hunter2value" in text for _code, text in outputs.values())


def test_an_override_applied_twice_gives_each_job_its_own_value():
    """plan --auto applies one override text to many configurations, parsed once (a cache): each
    job still gets a value of its own, which changing in one job leaves the next one's alone."""
    first, second = {}, {}
    for data in (first, second):
        apply_overrides(data, ["environment={A: [1, 2]}", "hyperparameters.lr=0.5"])
    assert first == second == {"environment": {"A": [1, 2]}, "hyperparameters": {"lr": 0.5}}
    first["environment"]["A"].append(3)
    assert second["environment"]["A"] == [1, 2]
    third = {}
    apply_overrides(third, ["environment={A: [1, 2]}"])
    assert third["environment"]["A"] == [1, 2]  # the control: the cached value itself is unchanged
