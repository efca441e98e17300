"""The metric line the training script prints, and the SageMaker metric definitions that read it.

One format on both sides: `container` prints with `format_metric_line`, SageMaker's
MetricDefinitions (and smlaunch's own log summaries) parse with `METRIC_REGEXES`.
"""

from __future__ import annotations

PREFIX = "[metrics]"
_NUMBER = r"([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"

# name in SageMaker -> key in the metric line
METRICS = {
    "train:loss": "loss",
    "train:grad_norm": "grad_norm",
    "train:samples_per_sec": "samples_per_s",
    "train:tokens_per_sec": "tokens_per_s",
    "train:tokens_per_sec_per_gpu": "tokens_per_s_per_gpu",
    "train:tflops_per_gpu": "tflops_per_gpu",
    "train:mfu": "mfu",
    "validation:loss": "val_loss",  # the line of a validation step: `[metrics] step=40 val_loss=...`
}

# `\b` keeps `loss=` from matching inside `val_loss=` or `aux_loss=`.
METRIC_REGEXES = {name: rf"\[metrics\].*\b{key}={_NUMBER}" for name, key in METRICS.items()}

DEFAULT_METRIC_DEFINITIONS = [{"Name": name, "Regex": regex} for name, regex in METRIC_REGEXES.items()]


def format_metric_line(step: int, **values: float) -> str:
    """'[metrics] step=3 loss=2.5 ...': what the script prints once per logged step."""
    fields = " ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())
    return f"{PREFIX} step={step} {fields}"


def parse_metric_line(line: str) -> dict[str, int | float] | None:
    """The values of a metric line, wherever it sits in `line` (after a host prefix such as
    'algo-1 | ' or '[algo-1] '); None if `line` has none. Values that are not numbers are left out."""
    at = line.find(PREFIX)
    if at < 0:
        return None
    values: dict[str, int | float] = {}
    for pair in line[at + len(PREFIX):].split():
        key, sep, text = pair.partition("=")
        if not sep:
            continue
        try:
            values[key] = int(text)
        except ValueError:
            try:
                values[key] = float(text)
            except ValueError:
                continue
    return values if "step" in values else None
