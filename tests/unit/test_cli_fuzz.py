"""Hostile job files and `--set`/`--sweep` strings through the CLI's entry point, in process.

Whatever a user (or an attacker) writes, `smlaunch validate` answers 0 (valid) or 2 (invalid,
with the errors), and `smlaunch plan` 0, 1 or 2: never a traceback, never more than a few
seconds. The job files come from the job file's JSON schema (every field, values of its types
and of the wrong ones) and from YAML that parsers choke on: aliases that expand a billion-fold,
deep nesting, duplicate keys, dates, `!!binary`, `!!set`, tags, non-UTF-8 bytes, `extends:`
of devices, directories and binaries.
"""

from __future__ import annotations

import json
import os
import string
import traceback
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from launcher.cli.app import main
from launcher.config import ModelParallelParameters
from launcher.config.schema import job_file_schema
from launcher.wire.training.hyperparameters import TrainingHyperparameters
from tests.support.time_limit import time_limit

ROOT = Path(__file__).resolve().parents[2]
SEED_FILES = sorted(str(p) for p in (ROOT / "configs" / "seed").glob("p*.yaml"))
SCHEMA = job_file_schema()
DEFS = SCHEMA["$defs"]
# Fields whose validation leaves this machine (a git clone, the Hugging Face Hub) are not fuzzed.
NETWORK_FIELDS = {"git_config", "hf_pretrained_model_name_or_dir"}
FIELDS = sorted(set(SCHEMA["properties"]) - NETWORK_FIELDS - {"extends"})
MP_KEYS = sorted(ModelParallelParameters.model_fields)
HP_KEYS = sorted(set(TrainingHyperparameters.model_fields) - NETWORK_FIELDS)
DEADLINE = timedelta(seconds=3)  # per example
HARD_LIMIT_S = 6  # an example that never returns (a FIFO opened for reading) fails after this

# YAML scalars as written in a file: numbers at and past every bound, YAML 1.1's surprises,
# tags JSON cannot hold, paths that trouble the file system, and broken syntax.
HOSTILE_SCALARS = [
    "0", "-1", "1", "2", "3", "8", "63", "64", "4096", "4097", "2147483647", "-2147483648", "9" * 30,
    "9" * 5000, "1e309", "-.inf", ".nan", "0x7fffffff", "0o777", "1_000", "1:30:00", "true", "on", "no",
    "~", "null", "''", '""', "2024-01-31", "2001-12-14t21:59:43.10-05:00", "!!binary aGVsbG8=",
    "!!set {a, b}", "!!omap [{a: 1}]", "!!pairs [{a: 1}]", "!!python/object/apply:os.system [ls]",
    "!custom x", "!!str 5", "!!int '7'", "!!float 1", "*undefined", "&dangling x", '"a\\0b"',
    '"\\ud800"', '"\\x01"', "'" + "a" * 300 + "'", "'" + "/a" * 2100 + "'", "~nosuchuser/x", "~/x",
    "/dev/zero", "/proc/self/mem", "../../../../etc", "s3://", "s3://b/x", "file:///tmp", "local",
    "local_gpu", "ml.p5.48xlarge", "ml.p4d.24xlarge", "ml.c5.xlarge", "train.py", "nccl", "gloo",
    "llama3-tiny", "[", "]", "{", "}", "- x", "a: b: c", "? x", "|", ">", "%YAML 1.1", "---", "...",
]
SET_KEYS = FIELDS + MP_KEYS + [f"hyperparameters.{k}" for k in HP_KEYS] + [
    "distribution.torch_distributed.enabled", "distribution.smdistributed.modelparallel.enabled",
    "inputs.train", "environment.X", "tags", "extends"]
HOSTILE_SETS = [
    "tags[0].Key=x", "tags.0.Key=x", "distribution=5", "context_parallel_degree=2", "hyperparameters=[1]",
    "hyperparameters.lr=1", "a..b=1", ".a=1", "a.=1", "=1", "=", "", "no-equals", "instance_count=2147483647",
    "processes_per_host=2147483647", "tensor_parallel_degree=2147483647", "hybrid_shard_degree=-1",
    "hyperparameters.x=" + "[" * 40 + "]" * 40, "hyperparameters.x={a: 1, a: 2}", "entry_point=*.py",
    "hyperparameters.d=2024-01-01", "hyperparameters.b=!!binary aGVsbG8=", "source_dir=~nosuchuser/x",
    "source_dir=" + "x" * 5000, "entry_point=" + "x" * 300, "output_path=/" + "a/" * 2100,
    "checkpoint_local_path=~nosuchuser/c", "inputs.train=~nosuchuser/d", "dependencies=[~nosuchuser/e]",
    "hyperparameters.s=\udcff", "\udcff=1", "extends=/dev/zero",
    "instance_type=local", "instance_type=ml.p5.48xlarge", "x" * 40 + "." * 40 + "=1",
    ".".join(["a"] * 40) + "=1",
]

quoted = st.text(max_size=12).map(json.dumps)  # a JSON string is a YAML double-quoted scalar
plain = st.text(alphabet=string.ascii_letters + string.digits + "_./:~-@ ", max_size=16)
scalar = st.one_of(st.sampled_from(HOSTILE_SCALARS), st.integers(-(2 ** 40), 2 ** 40).map(str), quoted, plain)
key_text = st.one_of(st.sampled_from(FIELDS + MP_KEYS + HP_KEYS + ["<<", "on", "1", "str", "int", "tags[0]",
                                                                  "? [a]", "''"]), quoted)


def flow(children):
    """A YAML flow list or mapping of `children` (YAML text)."""
    return st.one_of(
        st.lists(children, max_size=4).map(lambda xs: "[" + ", ".join(xs) + "]"),
        st.lists(st.tuples(key_text, children), max_size=4).map(
            lambda kv: "{" + ", ".join(f"{k}: {v}" for k, v in kv) + "}"),
    )


any_value = st.recursive(scalar, flow, max_leaves=8)


def _mapping(pairs: list[tuple[str, str]]) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in pairs) + "}"


def from_schema(prop: dict, depth: int = 0) -> st.SearchStrategy[str]:
    """YAML text of a value of the schema `prop`: mostly of its type, sometimes anything."""
    if "$ref" in prop:
        prop = DEFS[prop["$ref"].rsplit("/", 1)[-1]]
    options = [any_value]
    for alt in prop.get("anyOf", []) + prop.get("oneOf", []):
        options.append(from_schema(alt, depth + 1))
    if "enum" in prop:
        options.append(st.sampled_from([json.dumps(v) for v in prop["enum"]]))
    kind = prop.get("type")
    if kind == "integer":
        low, high = prop.get("minimum", -5), prop.get("maximum", 2 ** 31)
        options.append(st.one_of(st.integers(low - 1, low + 8), st.sampled_from([high, high + 1])).map(str))
    elif kind == "number":
        options.append(st.floats(allow_nan=True, allow_infinity=True).map(repr).map(
            lambda t: {"nan": ".nan", "inf": ".inf", "-inf": "-.inf"}.get(t, t)))
    elif kind == "boolean":
        options.append(st.sampled_from(["true", "false", "1", "0", "yes", "'true'"]))
    elif kind == "string":
        options.append(st.one_of(quoted, plain))
    elif kind == "array" and depth < 3:
        options.append(st.lists(from_schema(prop.get("items", {}), depth + 1), max_size=3).map(
            lambda xs: "[" + ", ".join(xs) + "]"))
    elif kind == "object" and depth < 3 and prop.get("properties"):
        fields = prop["properties"]
        names = sorted(set(fields) - NETWORK_FIELDS)
        options.append(st.lists(st.sampled_from(names), max_size=5, unique=True).flatmap(
            lambda keys: st.tuples(*(from_schema(fields[k], depth + 1) for k in keys)).map(
                lambda values, keys=keys: _mapping(list(zip(keys, values))))))
    return st.one_of(options)


FIELD_VALUES = {name: from_schema(SCHEMA["properties"][name]) for name in FIELDS}


@st.composite
def job_lines(draw) -> list[str]:
    """A near-valid job: entry point and instance type, then fields of the schema."""
    lines = ["entry_point: train.py",
             f"instance_type: {draw(st.sampled_from(['local', 'ml.p4d.24xlarge', 'ml.p5.48xlarge', 'bogus']))}"]
    for name in draw(st.lists(st.sampled_from(FIELDS), max_size=6, unique=True)):
        if name not in ("entry_point", "instance_type"):
            lines.append(f"{name}: {draw(FIELD_VALUES[name])}")
    return lines


def billion_laughs(width: int, levels: int) -> list[str]:
    lines = ["hyperparameters:", f"  l0: &l0 [{', '.join(['lol'] * width)}]"]
    lines += [f"  l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return lines


# Paths that trouble the file system: no such user, too long, devices, a FIFO, NUL, escapes.
HOSTILE_PATHS = ["~nosuchuser/x", "~/x", "'" + "a" * 300 + "'", "'" + "/a" * 2100 + "'", "/dev/zero",
                 "/proc/self/mem", "fifo", '"a\\0b"', "file://~nosuchuser/x", "../../../..", ".", "''", "s3://",
                 "/", "job.yaml"]
PATH_FIELDS = ["source_dir", "entry_point", "output_path", "checkpoint_local_path", "code_location"]
path_line = st.one_of(
    st.tuples(st.sampled_from(PATH_FIELDS), st.sampled_from(HOSTILE_PATHS)).map(": ".join),
    st.lists(st.sampled_from(HOSTILE_PATHS), min_size=1, max_size=2).map(
        lambda ps: f"dependencies: [{', '.join(ps)}]"),
    st.sampled_from(HOSTILE_PATHS).map(lambda p: f"inputs: {{train: {p}}}"),
    st.sampled_from(HOSTILE_PATHS).map(lambda p: f"inputs: {p}"),
)

EXTENDS = ["/dev/zero", "/proc/self/mem", "/dev/null", "/bin/ls", ".", "missing.yaml", "job.yaml", "base.yaml",
           "''", "5", "[a]", "~nosuchuser/base.yaml", "a" * 300, "/" + "a/" * 2100, "fifo"]


@st.composite
def job_file(draw) -> bytes:
    lines = draw(job_lines())
    modes = ["plain"] * 4 + ["seed"] * 3 + ["paths"] * 2 + ["laughs", "deep", "duplicate", "recursive", "extends",
                                                            "merge"]
    mode = draw(st.sampled_from(modes))
    if mode == "paths":
        lines = [line for line in lines if not line.startswith(tuple(PATH_FIELDS + ["dependencies", "inputs"]))]
        lines.append(draw(path_line))
    elif mode == "seed":  # a complete job (SageMaker, SMP, S3 channels) with some fields changed
        lines = [f"extends: {draw(st.sampled_from(SEED_FILES))}"] + lines[2:]
    elif mode == "laughs":
        lines += billion_laughs(draw(st.integers(2, 12)), draw(st.integers(2, 9)))
    elif mode == "deep":
        depth = draw(st.integers(0, 80))
        opener = draw(st.sampled_from(["[", "{a: "]))
        closer = "]" if opener == "[" else "}"
        lines.append(f"hyperparameters: {{x: {opener * depth}{closer * depth}}}")
    elif mode == "duplicate":
        lines.append(draw(st.sampled_from(lines)))
    elif mode == "recursive":
        lines.append("hyperparameters: &r {x: *r}")
    elif mode == "extends":
        lines.append(f"extends: {draw(st.sampled_from(EXTENDS))}")
    elif mode == "merge":
        lines += ["environment: &env {A: '1'}", f"tags: {{<<: *env, {draw(key_text)}: {draw(scalar)}}}"]
    data = "\n".join(lines).encode("utf-8", "surrogatepass") + b"\n"
    damage = draw(st.sampled_from(["none"] * 12 + ["bytes", "utf16", "bom", "nul"]))
    if damage == "bytes":
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.binary(min_size=1, max_size=3)) + data[at:]
    elif damage == "utf16":
        data = data.decode("utf-8", "replace").encode("utf-16")
    elif damage == "bom":
        data = b"\xef\xbb\xbf" + data
    elif damage == "nul":
        data = data.replace(b"\n", b"\n\x00", 1)
    return data


def _field_set(key: str) -> st.SearchStrategy[str]:
    return FIELD_VALUES[key].map(lambda value: f"{key}={value}")


set_item = st.one_of(
    st.sampled_from(FIELDS).flatmap(_field_set),  # a field of the schema, a value of (mostly) its type
    st.tuples(st.sampled_from(SET_KEYS), any_value).map("=".join),
    st.sampled_from(HOSTILE_SETS),
    st.tuples(st.lists(st.sampled_from(SET_KEYS + ["x", "parameters"]), min_size=1, max_size=4).map(".".join),
              scalar).map("=".join),
    st.text(max_size=20),
).filter(lambda s: "\0" not in s)  # argv cannot carry NUL


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fuzz")
    (root / "train.py").write_text("")
    (root / "base.yaml").write_text("entry_point: train.py\ninstance_type: local\n")
    (root / "minimal.yaml").write_text("entry_point: train.py\ninstance_type: local\n")
    os.mkfifo(root / "fifo")
    return root


@pytest.fixture(scope="module", autouse=True)
def _offline(workdir):
    """No Hub, no AWS: validation stays on this machine (it does: the fuzz would time out if not)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setenv("HF_HOME", str(workdir / "hf"))
    mp.setenv("SMLAUNCH_HOME", str(workdir / "home"))
    yield
    mp.undo()


def invoke(args: list[str], codes: tuple[int, ...]):
    with time_limit(HARD_LIMIT_S):
        result = CliRunner().invoke(main, args)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        trace = "".join(traceback.format_exception(*result.exc_info))
        raise AssertionError(f"smlaunch {args!r} raised:\n{trace}")
    assert result.exit_code in codes, (args, result.exit_code, result.output)
    assert "Traceback" not in result.output, result.output
    return result


def test_the_everyday_loops_run_a_share_of_the_examples(monkeypatch):
    monkeypatch.setenv("SMLAUNCH_FUZZ_SHARE", "0.1")
    assert examples(3000) == 300 and examples(3) == 1
    monkeypatch.delenv("SMLAUNCH_FUZZ_SHARE")
    assert examples(3000) == 3000  # the control: make test's, every example
    for wrong in ("0", "1.5", "a tenth"):
        monkeypatch.setenv("SMLAUNCH_FUZZ_SHARE", wrong)
        with pytest.raises(pytest.UsageError, match=f"SMLAUNCH_FUZZ_SHARE='{wrong}'"):
            examples(3000)


def test_the_fuzz_runs_offline_and_warm(workdir):
    """Warm-up (imports, catalogs) outside the timed examples; a minimal job is valid."""
    (workdir / "job.yaml").write_text("entry_point: train.py\ninstance_type: local\n")
    assert invoke(["validate", str(workdir / "job.yaml")], (0,)).exit_code == 0


FUZZ = settings(deadline=DEADLINE, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def examples(full: int) -> int:
    """`make test` and CI run every example (a third of tests/unit's time); the everyday loops,
    `make unit` and `make check`, a share of them (SMLAUNCH_FUZZ_SHARE=0.1: the first examples of
    the same derandomized sequence), to stay under two minutes."""
    raw = os.environ.get("SMLAUNCH_FUZZ_SHARE", "1")
    try:
        share = float(raw)
    except ValueError:
        share = 0.0
    if not 0 < share <= 1:
        raise pytest.UsageError(f"SMLAUNCH_FUZZ_SHARE={raw!r}: give a number above 0 and at most 1 (1: every example)")
    return max(1, round(full * share))


@settings(FUZZ, max_examples=examples(3000))
@given(data=job_file(), as_json=st.booleans())
def test_validate_of_any_job_file_answers_0_or_2(workdir, data, as_json):
    path = workdir / "job.yaml"
    path.write_bytes(data)
    event(f"exit {invoke(['validate', str(path)] + (['--json'] if as_json else []), (0, 2)).exit_code}")


@settings(FUZZ, max_examples=examples(2000))
@given(base=st.sampled_from(SEED_FILES + ["minimal"]), sets=st.lists(set_item, min_size=1, max_size=3))
def test_validate_with_any_set_answers_0_or_2(workdir, base, sets):
    """Overrides of valid jobs (one bad --set is reported before validation, so few per example)."""
    path = workdir / "minimal.yaml" if base == "minimal" else base
    args = ["validate", str(path), *(a for s in sets for a in ("--set", s))]
    event(f"exit {invoke(args, (0, 2)).exit_code}")


sweep_item = st.one_of(
    st.tuples(st.sampled_from(MP_KEYS + ["instance_count", "processes_per_host", "hyperparameters.max_context_width",
                                         "hyperparameters.activation_checkpointing", "instance_type"]),
              st.lists(st.one_of(st.integers(-1, 4097).map(str), scalar), min_size=1, max_size=3).map(",".join)
              ).map("=".join),
    st.tuples(st.sampled_from(SET_KEYS), st.lists(scalar, min_size=1, max_size=3).map(",".join)).map("=".join),
    st.sampled_from(["context_parallel_degree=1,2,4,8", "tags[0].Key=a,b", "distribution=5", "=1", "x", "a..b=1",
                     "context_parallel_degree=", "hybrid_shard_degree=2147483647,0", "instance_count=4096,4097"]),
    st.text(max_size=16),
).filter(lambda s: "\0" not in s)


@settings(FUZZ, max_examples=examples(300))
@given(seed=st.sampled_from(SEED_FILES), sweeps=st.lists(sweep_item, min_size=1, max_size=2),
       sets=st.lists(set_item, max_size=1), auto=st.booleans())
def test_plan_sweep_answers_0_1_or_2(seed, sweeps, sets, auto):
    args = ["plan", seed, "--json"] + (["--auto"] if auto else [])
    args += [a for s in sets for a in ("--set", s)] + [a for s in sweeps for a in ("--sweep", s)]
    event(f"exit {invoke(args, (0, 1, 2)).exit_code}")
