"""validate_job: structural checks (pydantic) and cross-field rules, all reported at once.

A structurally broken field is reported, then removed so its default stands in, and the rules
still run on the rest: a typo in one key does not hide a wrong degree in another.
"""

from __future__ import annotations

import copy
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

# Imports inside functions: git_source (and subprocess) loads only for a job with git_config (CLI
# start-up: `smlaunch validate` of any other job does not pay for it).
from launcher.config import (
    aws_rules,
    backend_rules,
    checkpoint_rules,
    code_rules,
    data_rules,
    hang_rules,
    job_rules,
    json_values,
    model_rules,
    request_limits,
    requirement_paths,
    restarts,
    resume_rules,
    rules,
    runtime_rules,
    script_rules,
    shrink_rules,
    tuning_rules,
    warm_pools,
)
from launcher.config.context import Context
from launcher.config.job import JobConfig
from launcher.config.job_kind import JobKind, for_user_scripts, job_kind
from launcher.config.paths import check_path_text
from launcher.wire.training import catalog
from launcher.wire.training.base import BOOLEAN_NOT_NUMBER
from launcher.wire.training.hyperparameters import FP8Config
from launcher.wire.training.issues import ConfigError, Issue, did_you_mean
from launcher.wire.training.layout import ParallelLayout, with_sharding_strategy
from launcher.wire.training.models import ModelSpec
from launcher.wire.training.run_settings import RunSettings, run_settings


@dataclass
class ValidatedJob:
    """A job that passed validation, with what the checks derived from it."""

    config: JobConfig
    instance: catalog.InstanceType | None
    processes_per_host: int | None
    layout: ParallelLayout | None
    model: ModelSpec | None
    fp8: FP8Config
    base_dir: Path
    kind: JobKind
    warnings: list[Issue] = field(default_factory=list)
    # a user script that uses AWS's SMP library, v2 or v1 (launcher.config.script_rules.uses_smp)
    smp_script: bool = False
    notes: list[Issue] = field(default_factory=list)  # info: what the user should know (resume_rules.py)
    # the job files it was read from (the extends chain, resolved): they hold its environment's
    # secrets, so no code archive ships them (launcher.backends.sourcedir)
    files: tuple[Path, ...] = ()

    @property
    def settings(self) -> RunSettings | None:
        """What smlaunch's runtime would do (launcher.wire.training.run_settings: the function the trainer
        runs and the planner sizes); None while the world is unknown (local_gpu). A user script's
        job gets them too: the planner sizes it as the runtime would run it."""
        if self.layout is None:
            return None
        dist = self.config.distribution
        return run_settings(self.config.hyperparameters, dist.parameters if dist else None, self.layout.world)


def validate_job(
    data: Mapping[str, Any] | JobConfig,
    *,
    base_dir: str | Path | None = None,
    source: str | None = None,
    model: type[JobConfig] = JobConfig,
) -> ValidatedJob:
    """Validate a job; raise ConfigError listing every error, or return the validated job."""
    base = Path(base_dir) if base_dir is not None else Path.cwd()
    if isinstance(data, BaseModel):
        raw = data.model_dump(exclude_unset=True)
        raw["hyperparameters"] = data.hyperparameters.raw()
    elif isinstance(data, Mapping):
        raw = dict(data)
        if value_issues := json_values.value_issues(raw):  # before pydantic, which would recurse on a cycle
            raise ConfigError(value_issues, source)
    else:
        raise ConfigError([Issue("job", data, f"is of type {type(data).__name__}, not a mapping of settings",
                                 "give the job as a mapping (a dict, or a YAML mapping)")], source)
    if raw.get("git_config"):
        from launcher.config import git_source

        raw = git_source.apply(raw)
    # The entry point decides whether the runtime's stricter hyperparameters apply (job_kind.py).
    kind = _kind_as_written(raw, base)
    if kind is None:  # read as a user script's job first; its entry point and source_dir then tell
        job, issues, pruned = parse_lenient(for_user_scripts(model), raw)
        kind = job_kind(job_rules.entry_point_path(job, base), job.entry_point) if job is not None else None
        if kind is not None and kind.runtime:
            job, issues, pruned = parse_lenient(model, raw)
    else:
        job, issues, pruned = parse_lenient(model if kind.runtime else for_user_scripts(model), raw)
        if job is None and kind.runtime:
            # What cannot be read at all is reported as it is read for a user script (the two
            # models differ only in hyperparameters, whose errors never stop the reading).
            script_job, script_issues, _ = parse_lenient(for_user_scripts(model), raw)
            if script_job is None:
                issues = script_issues
    if job is None:
        raise ConfigError(issues, source)
    issues += _rule_issues(job, kind, base, pruned, out := {})
    errors = [i for i in issues if i.level == "error"]
    if errors:
        raise ConfigError(issues, source)
    world = out["ctx"].world
    ctx = out["ctx"]
    layout = ParallelLayout.from_parameters(
        with_sharding_strategy(ctx.params, ctx.hp.sharding_strategy, ctx.processes_per_host), world) if world else None
    validated = ValidatedJob(
        config=job,
        instance=out["ctx"].instance,
        processes_per_host=out["ctx"].processes_per_host,
        layout=layout,
        model=out["ctx"].model,
        fp8=out["fp8"],
        base_dir=base,
        kind=kind,
        warnings=[i for i in issues if i.level == "warning"],
        notes=[i for i in issues if i.level == "info"],
        smp_script=ctx.smp_script,
    )
    if job.tuning is not None:  # every trial is a job of this kind (tuning_rules.py)
        sweep = tuning_rules.tuning_issues(validated, job.tuning, lambda raw: _trial_errors(raw, base, model))
        if any(i.level == "error" for i in sweep):
            raise ConfigError(issues + sweep, source)
        validated.warnings += [i for i in sweep if i.level == "warning"]
    return validated


def _trial_errors(raw: dict, base: Path, model: type[JobConfig]) -> list[Issue]:
    try:
        validate_job(raw, base_dir=base, model=model)
    except ConfigError as exc:
        return exc.issues
    return []


def _kind_as_written(raw: dict, base: Path) -> JobKind | None:
    """The job's kind from entry_point and source_dir as written, when the job model keeps both
    as they are (text that check_path_text accepts), so that the job is read by one model only;
    else None."""
    entry, source = raw.get("entry_point"), raw.get("source_dir")
    if type(entry) is not str or not (source is None or type(source) is str):
        return None
    try:
        for text in (entry, source or ""):
            check_path_text(text)
    except ValueError:
        return None
    return job_kind(job_rules.entry_point_file(entry, source, base), entry)


def _rule_issues(job: JobConfig, kind: JobKind, base: Path, pruned: list[str], out: dict) -> list[Issue]:
    inst, issues = rules.check_instance(job)
    pph, more = rules.processes_per_host(job, inst)
    issues += more
    model = model_rules.job_model(job, base, trainer=kind.runtime)
    issues += model.issues
    source = job_rules.code_dir(job, base)
    ctx = Context(job, inst, pph, model.spec, base, runtime=kind.runtime,
                        imports=None if kind.runtime else script_rules.entry_imports(
                            job_rules.entry_point_path(job, base), source),
                        code_dir=source, region=job.region or job_rules.DEFAULT_REGION)
    hp = job.hyperparameters
    # A user script's FP8 settings are its own; whether the accelerator has FP8 is the launcher's.
    fp8 = FP8Config.from_hyperparameters(hp) if kind.runtime else FP8Config(enabled=bool(hp.fp8),
                                                                           emulate=bool(hp.fp8_emulate))
    out.update(ctx=ctx, fp8=fp8)
    for check in (rules.check_launchers, rules.check_degrees, rules.check_memory_options,
                  rules.check_attention_kernel, data_rules.check_data_order, rules.check_backend,
                  backend_rules.check_backend_choice,
                  job_rules.check_job_fields, job_rules.check_hyperparameters, job_rules.check_image,
                  aws_rules.check_aws_settings, request_limits.check_hyperparameter_limits, resume_rules.check_resume,
                  resume_rules.check_resume_data, checkpoint_rules.check_async_checkpoint,
                  runtime_rules.check_nonfinite, hang_rules.check_hang_timeouts,
                  runtime_rules.check_speed, runtime_rules.check_compile, runtime_rules.check_lora,
                  script_rules.check_script_imports, requirement_paths.check_requirement_paths,
                  code_rules.check_code_trees,
                  runtime_rules.check_trackers, restarts.check_restarts, shrink_rules.check_min_instance_count,
                  warm_pools.check_warm_pool):
        issues += check(ctx)
    issues += rules.check_precision(ctx, fp8)
    # A rule may trip over the default that replaced a broken value; that value is reported.
    return [i for i in issues if not any(_within(i.path, p) for p in pruned)]


def parse_lenient(model: type[BaseModel], raw: dict) -> tuple[BaseModel | None, list[Issue], list[str]]:
    """Validate; on errors, report them, drop the offending values and try again."""
    data = copy.deepcopy(raw)
    issues: list[Issue] = []
    pruned: list[str] = []
    seen: set[tuple] = set()
    for _ in range(10):
        try:
            return model.model_validate(data), issues, pruned
        except ValidationError as exc:
            progressed = False
            for err in exc.errors(include_url=False):
                err["loc"] = data_loc(data, err["loc"])
                key = (err["loc"], err["type"])
                path = dotted(err["loc"])
                # A value already reported and dropped is not reported again as missing.
                if key not in seen and not (err["type"] == "missing" and path in pruned):
                    seen.add(key)
                    issues.append(issue_from_pydantic(model, err))
                    pruned.append(path)
                progressed |= _delete(data, err["loc"])
            if not progressed:
                return None, issues, pruned
    return None, issues, pruned


def issue_from_pydantic(model: type[BaseModel], err: dict) -> Issue:
    loc = err["loc"]
    path = dotted(loc)
    kind = err["type"]
    value = err.get("input")
    if kind == "extra_forbidden" and loc:
        allowed = _fields_at(model, loc[:-1])
        hint = did_you_mean(str(loc[-1]), allowed)
        return Issue(path, value, "unknown key", hint or "remove it")
    if kind == "missing":
        return Issue(path, None, "required field is missing", "add it")
    if kind == "literal_error":
        expected = err.get("ctx", {}).get("expected", "")
        options = [o.strip(" '") for o in expected.replace(" or ", ",").split(",") if o.strip()]
        return Issue(path, value, "not an allowed value", did_you_mean(str(value), options))
    ctx = err.get("ctx", {})
    if kind in ("int_type", "float_type") and isinstance(value, bool):
        return Issue(path, value, *BOOLEAN_NOT_NUMBER)
    if kind in ("int_type", "float_type") and isinstance(value, str):
        number = "whole number" if kind == "int_type" else "number"
        return Issue(path, value, f"is text, not a {number}", f"write a {number}, without quotes")
    message = err["msg"].removeprefix("Value error, ")
    if kind == "value_error" and "; " in message:  # our validators say "problem; fix"
        problem, fix = message.split("; ", 1)
        return Issue(path, value, problem, fix)
    fix = {
        "int_parsing": "use a whole number",
        "int_from_float": "use a whole number",
        "int_type": "use a whole number",
        "float_parsing": "use a number",
        "float_type": "use a number",
        "finite_number": "use a finite number (not .inf or .nan)",
        "invalid_key": "write the name as a string (quote it)",
        "too_long": f"use at most {ctx.get('max_length')} entries",
        "bool_parsing": "use true/false (or 1/0)",
        "bool_type": "use true/false (or 1/0)",
        "string_type": "use a string",
        "dict_type": "use a mapping of keys to values",
        "model_type": "use a mapping of keys to values",
        "model_attributes_type": "use a mapping of keys to values",
        "list_type": "use a list",
        "greater_than_equal": f"use a value >= {ctx.get('ge')}",
        "greater_than": f"use a value > {ctx.get('gt')}",
        "less_than_equal": f"use a value <= {ctx.get('le')}",
        "less_than": f"use a value < {ctx.get('lt')}",
        "string_too_short": f"use at least {ctx.get('min_length')} character(s)",
        "string_too_long": f"use at most {ctx.get('max_length')} characters",
        "string_pattern_mismatch": f"match the pattern {ctx.get('pattern')}",
    }.get(kind, "see `smlaunch schema` for what this field takes")
    return Issue(path, value, message, fix)


def dotted(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part == "":  # an empty key, which a dot would hide
            out += '[""]'
        else:
            out += f".{part}" if out else str(part)
    return out


def _within(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith((prefix + ".", prefix + "["))


def data_loc(data: Any, loc: tuple) -> tuple:
    """`loc` without the union members' type names pydantic puts in it ('list[Tag]', 'str',
    'function-after[...]'): a part is such a name only where the data has no key of that name,
    so a user's key that happens to read `str` or `tags[0]` keeps its place."""
    out, node = [], data
    for part in loc:
        if (isinstance(node, dict) and part in node
                or isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)):
            node = node[part]
        elif _is_union_tag(part):
            continue
        else:
            node = None
        out.append(part)
    return tuple(out)


def _is_union_tag(part: Any) -> bool:
    return isinstance(part, str) and (part in ("str", "int", "bool") or "[" in part or
                                      part in ("ChannelInput", "function-after[_compiles(), str]"))


def _delete(data: Any, loc: tuple) -> bool:
    if not loc:
        return False
    parent = data
    for part in loc[:-1]:
        try:
            parent = parent[part]
        except (KeyError, IndexError, TypeError):
            return False
    last = loc[-1]
    try:
        if isinstance(parent, dict) and last in parent:
            del parent[last]
            return True
        if isinstance(parent, list) and isinstance(last, int) and last < len(parent):
            parent.pop(last)
            return True
    except TypeError:
        pass
    return False


def _fields_at(model: type[BaseModel], loc: tuple) -> list[str]:
    cls: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        info = getattr(cls, "model_fields", {}).get(part)
        if info is None:
            return []
        cls = _model_in(info.annotation)
        if cls is None:
            return []
    return list(getattr(cls, "model_fields", {}))


def _model_in(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None
