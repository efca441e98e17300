"""`python -m container trace`: one rank of a job traced at its whole world on a fake process group
(`smlaunch plan --trace`; the request and the result are launcher.wire.trace_record's)."""

# Imports inside functions: importing a submodule runs this package's __init__, which must not load
# torch and the runtime before `python -m container`'s usage check.
from __future__ import annotations

import sys
import warnings


def main() -> int:
    """Read the request on standard input, print the result line; 0 traced (or not traced, with
    why), 1 the trace failed (the result's `error` says where)."""
    from container.trace.step import trace_rank
    from launcher.wire.trace_record import TraceRequest, result_line

    request = TraceRequest.from_json(sys.stdin.read())
    warnings.filterwarnings("ignore")  # torch's warnings about the fake group are not the job's
    result = trace_rank(request)
    print(result_line(result), flush=True)
    return 1 if "error" in result else 0
