"""Job files and `--set` strings that once crashed or hung smlaunch: each is now a clear error.

The reader (launcher.config.safe_yaml) takes JSON values only and bounds size, depth and alias
expansion; the job file loader (launcher.config.jobfile) reads regular UTF-8 files only; `--set`
refuses what it cannot set. Every error names the file or option, the value and the fix.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from launcher.cli.app import main
from launcher.config import safe_yaml
from launcher.config.jobfile import MAX_EXTENDS, MAX_FILE_BYTES, apply_overrides, load_job_file
from launcher.config.safe_yaml import MAX_DEPTH, MAX_NODES, YamlProblem, loads
from launcher.wire.training.issues import ConfigError
from tests.support.time_limit import time_limit

MINIMAL = "entry_point: train.py\ninstance_type: local\n"


@pytest.fixture
def job(tmp_path):
    """Write a job file (text or bytes) next to an empty train.py; return its path."""
    (tmp_path / "train.py").write_text("")

    def write(content: str | bytes, name: str = "job.yaml") -> Path:
        path = tmp_path / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        return path

    return write


def problem_of(text: str) -> YamlProblem:
    with pytest.raises(YamlProblem) as info:
        loads(text)
    return info.value


def error_of(path: Path, overrides=()) -> str:
    with pytest.raises(ConfigError) as info:
        load_job_file(path, overrides)
    return str(info.value)


# --- the YAML reader ---------------------------------------------------------------------------
def test_duplicate_keys_are_refused_with_both_lines():
    problem = problem_of("a: 1\nb:\n  c: 1\n  c: 2\n")
    assert "duplicate key 'c' (first at line 3)" in problem.problem and problem.line == 4


def test_a_merge_key_may_be_overridden():
    assert loads("base: &b {x: 1, y: 2}\njob: {<<: *b, y: 3}\n")["job"] == {"x": 1, "y": 3}


def test_a_billion_laughs_is_refused_at_once():
    levels = ["l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    levels += [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, 9)]
    start = time.monotonic()
    problem = problem_of("\n".join(levels) + "\n")
    assert time.monotonic() - start < 1.0
    assert f"more than {MAX_NODES:,} values" in problem.problem


def test_aliases_within_bounds_are_read():
    assert loads("a: &a [1, 2]\nb: *a\n") == {"a": [1, 2], "b": [1, 2]}


def test_an_alias_inside_its_own_anchor_is_refused():
    assert "refers to the anchor that contains it" in problem_of("a: &r {x: *r}\n").problem


def _without_libyaml():
    """launcher.config.safe_yaml as a PyYAML built without libyaml loads it (yaml._yaml unimportable)."""
    spec = importlib.util.find_spec(safe_yaml.__name__)
    module = importlib.util.module_from_spec(spec)
    saved = sys.modules.get("yaml._yaml")
    sys.modules["yaml._yaml"] = None  # an import of it raises ImportError
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop("yaml._yaml")
        if saved is not None:
            sys.modules["yaml._yaml"] = saved
    return module


@pytest.mark.parametrize("text,words", [
    ("a: 1\na: 2\n", r"duplicate key 'a' \(first at line 1\)"), ("a: &r {x: *r}\n", "refers to the anchor"),
    ("[" * 2000 + "]" * 2000, f"nested more than {MAX_DEPTH}"), ("a: 2024-01-31\n", "a YAML date"),
    ('a: "\\ud800"\n', "lone surrogate"), ("a: \ud800\n", "lone surrogate|#xd800"),
    ("a: [1, 2\n", "invalid YAML"), ("a: \x07\n", "control characters")])
def test_libyaml_and_pyyamls_own_parser_refuse_alike(text, words):
    """libyaml parses (safe_yaml); where PyYAML lacks it, PyYAML's Python parser does, under the same checks."""
    python = _without_libyaml()
    assert python._Parser.__module__ == "launcher.config.safe_yaml" and safe_yaml._Parser.__module__ == "yaml._yaml"
    for module in (safe_yaml, python):
        with pytest.raises(module.YamlProblem) as info:
            module.loads(text)
        assert re.search(words, info.value.problem + info.value.fix), (module._Parser, info.value.problem)
    seed = (Path(__file__).parents[2] / "configs" / "seed" / "base.yaml").read_text()
    assert python.loads(seed) == loads(seed) != {}  # the control: both read a job alike


def test_nesting_is_bounded_literally_and_through_aliases():
    assert loads("[" * MAX_DEPTH + "]" * MAX_DEPTH) is not None
    assert f"nested more than {MAX_DEPTH} levels" in problem_of("[" * 2000 + "]" * 2000).problem
    half = MAX_DEPTH // 2 + 1  # each half fits; the alias puts one inside the other
    text = f"a: &a {'[' * half}{']' * half}\nb: {'[' * half}*a{']' * half}\n"
    assert f"nested more than {MAX_DEPTH} levels" in problem_of(text).problem


@pytest.mark.parametrize("value,words", [
    ("2024-01-31", ["a YAML date", "quote it"]),
    ("2001-12-14t21:59:43.10-05:00", ["a YAML date"]),
    ("!!binary aGVsbG8=", ["!!binary data"]),
    ("!!set {a, b}", ["!!set", "use a list"]),
    ("!!omap [{a: 1}]", ["!!omap"]),
    ('"a\\0b"', ["NUL"]),
    ('"\\ud800"', ["lone surrogate"]),
    ("9" * 5000, ["integer cannot be read"]),
    ("!!python/object/apply:os.system [ls]", ["invalid YAML", "could not determine a constructor"]),
])
def test_values_json_cannot_hold_are_refused_with_their_line(value, words):
    problem = problem_of(f"a: 1\nb: {value}\n")
    assert problem.line == 2, problem.problem
    for word in words:
        assert word in problem.problem + problem.fix


def test_quoted_dates_stay_text():
    assert loads("d: '2024-01-31'\n") == {"d": "2024-01-31"}


@pytest.mark.parametrize("key", ["on", "1", "null", "[a]"])
def test_keys_must_be_text(key):
    assert "not text" in problem_of(f"x: 1\n{key}: 2\n").problem


# --- job files -----------------------------------------------------------------------------------
def test_a_file_that_is_not_utf8_names_the_byte(job):
    assert "is not UTF-8 text (byte 0xff at offset 22)" in error_of(job(MINIMAL.encode()[:22] + b"\xff\n"))
    assert "is not UTF-8 text" in error_of(job(MINIMAL.encode("utf-16")))
    assert load_job_file(job(b"\xef\xbb\xbf" + MINIMAL.encode()))[0]["instance_type"] == "local"  # a BOM is fine


@pytest.mark.parametrize("target,kind", [
    ("/dev/zero", "is not a YAML job file"), ("zero.yaml", "is not a YAML job file"),
    ("fifo.yaml", "is a FIFO, not a file"), ("dir.yaml", "is a directory, not a file")])
def test_extends_of_a_device_fifo_or_directory_is_refused_before_reading(job, tmp_path, target, kind):
    os.mkfifo(tmp_path / "fifo.yaml")
    (tmp_path / "dir.yaml").mkdir()
    (tmp_path / "zero.yaml").symlink_to("/dev/zero")  # judged by what it resolves to
    start = time.monotonic()
    assert kind in error_of(job(MINIMAL + f"extends: {target}\n"))
    assert time.monotonic() - start < 1.0


def test_extends_of_a_binary_is_not_utf8(job, tmp_path):
    (tmp_path / "ls.yaml").write_bytes(Path("/bin/ls").read_bytes()[:4096])
    assert "is not UTF-8" in error_of(job(MINIMAL + "extends: ls.yaml\n"))


def test_a_large_file_is_refused(job):
    text = MINIMAL + "# padding\n" * (MAX_FILE_BYTES // 10)
    assert f"larger than {MAX_FILE_BYTES // 1024} KiB" in error_of(job(text))


def test_extends_chains_are_bounded(job):
    for i in range(MAX_EXTENDS + 1):
        job(f"extends: b{i + 1}.yaml\n", f"b{i}.yaml")
    job(MINIMAL, f"b{MAX_EXTENDS + 1}.yaml")
    assert f"longer than {MAX_EXTENDS} files" in error_of(job("extends: b0.yaml\n"))


def test_an_empty_extends_is_refused(job):
    assert "extends" in error_of(job(MINIMAL + "extends: ''\n"))


@pytest.mark.parametrize("line,field", [("source_dir: ~nosuchuser/code", "source_dir"),
                                        ("dependencies: [lib, ~nosuchuser/x]", "dependencies[1]")])
def test_home_of_no_user_names_the_field(job, line, field):
    message = error_of(job(MINIMAL + line + "\n"))
    assert f"{field} = " in message and "~nosuchuser names no user" in message


# --- --set -----------------------------------------------------------------------------------------
def set_error(*items: str, data: dict | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        apply_overrides(data if data is not None else {}, items)
    assert all(i.path == "--set" for i in info.value.issues)
    return str(info.value)


def test_list_items_cannot_be_set_and_the_error_says_how_to_set_the_list():
    message = set_error("tags[0].Key=x")
    assert "indexes a list" in message and "--set 'tags=[{Key: x, Value: y}]'" in message
    assert "list items cannot be set" in set_error("tags.0.Key=x", data={"tags": [{"Key": "a"}]})


def test_a_key_below_a_value_that_is_not_a_mapping_names_both():
    message = set_error("distribution=5", "context_parallel_degree=2")
    assert "distribution is 5, not a mapping, so it has no key 'smdistributed'" in message


@pytest.mark.parametrize("item", ["hyperparameters..x=1", ".a=1", "a.=1"])
def test_keys_with_empty_parts_are_refused(item):
    assert "has an empty part" in set_error(item)


def test_keys_are_bounded():
    assert f"more than {MAX_DEPTH} parts" in set_error(".".join(["hyperparameters"] * 40) + "=1")


@pytest.mark.parametrize("item,words", [("entry_point=*.py", ["invalid YAML", "quote the value"]),
                                        ("hyperparameters.d=2024-01-01", ["a YAML date"]),
                                        ("hyperparameters.m={a: 1, a: 2}", ["duplicate key 'a'"])])
def test_set_values_are_read_like_job_files(item, words):
    message = set_error(item)
    for word in words:
        assert word in message


# --- through the CLI: exit 2, the error, no traceback, in well under a second -----------------------
LAUGHS = "hyperparameters:\n" + "\n".join(
    [f"  l0: &l0 [{', '.join(['lol'] * 9)}]"] +
    [f"  l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 9)]) + "\n"
REPORTED = {
    "deep-lists": (MINIMAL + "hyperparameters: {x: " + "[" * 3000 + "]" * 3000 + "}\n", [], "nested more than"),
    "binary-file": (b"\x7fELF\x02\x01\x01\x00\xff\xfe", [], "not UTF-8"),
    "extends-binary": (MINIMAL + "extends: /bin/ls\n", [], "is not a YAML job file"),
    "extends-dev-zero": (MINIMAL + "extends: /dev/zero\n", [], "is not a YAML job file"),
    "no-such-user": ("entry_point: train.py\ninstance_type: local\nsource_dir: ~nosuchuser/code\n", [],
                     "names no user"),
    "duplicate-keys": (MINIMAL + "instance_type: ml.p5.48xlarge\n", [], "duplicate key 'instance_type'"),
    "billion-laughs": (MINIMAL + LAUGHS, [], "more than 20,000 values"),
    "yaml-date": (MINIMAL + "hyperparameters: {start: 2024-01-31}\n", [], "a YAML date"),
    "set-list-index": (MINIMAL, ["tags[0].Key=x"], "indexes a list"),
    "set-below-a-number": (MINIMAL, ["distribution=5", "context_parallel_degree=2"], "distribution is 5"),
}


@pytest.mark.parametrize("content,sets,words", REPORTED.values(), ids=REPORTED.keys())
def test_reported_crashes_are_validation_errors(job, content, sets, words):
    args = ["validate", str(job(content))] + [a for s in sets for a in ("--set", s)]
    start = time.monotonic()
    result = CliRunner().invoke(main, args)
    assert time.monotonic() - start < 2.0
    assert result.exit_code == 2, (result.exception, result.output)
    assert words in result.stderr and "Traceback" not in result.output


# Found by the fuzz test, fixed in launcher.config (paths the file system refuses, user keys that
# look like pydantic's union tags, an entry point that is a FIFO), and the reported divisor loop.
CONFIG_SIDE = {
    "entry-point-of-no-user": (MINIMAL + "dependencies: [a]\n", ["entry_point=~nosuchuser/train.py"]),
    "set-source-dir-of-no-user": (MINIMAL, ["source_dir=~nosuchuser/code"]),
    "over-long-path": (MINIMAL + "source_dir: '" + "/a" * 2100 + "'\n", []),
    "over-long-name": ("instance_type: local\nentry_point: '" + "a" * 300 + "'\n", []),
    "key-like-a-union-tag": (MINIMAL + "tags[0]: {Key: x}\n", []),
    "entry-point-fifo": ("instance_type: local\nentry_point: fifo\n", []),
    "huge-instance-count": ("entry_point: train.py\ninstance_type: ml.p4d.24xlarge\ninstance_count: 2147483647\n",
                            ["context_parallel_degree=3"]),
}


@pytest.mark.parametrize("content,sets", CONFIG_SIDE.values(), ids=CONFIG_SIDE.keys())
def test_paths_and_keys_that_troubled_validation(job, tmp_path, content, sets):
    os.mkfifo(tmp_path / "fifo")
    args = ["validate", str(job(content))] + [a for s in sets for a in ("--set", s)]
    start = time.monotonic()
    with time_limit(5):
        result = CliRunner().invoke(main, args)
    assert time.monotonic() - start < 3.0
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code in (0, 2) and "Traceback" not in result.output
