"""`python -m container trace`: ranks of jobs traced at their whole world on a fake process group
(`smlaunch plan --trace`; the requests and the results are launcher.wire.trace_record's).

One request is traced in this process. Several (a pipelined job's ranks, or the jobs of a batch:
launcher.plan.trace.trace_jobs) are each traced in a process forked from this one once it has
imported torch and the runtime (~3 of the ~3.7 CPU s a small job's trace takes): the fake process
group, the meshes and what context parallelism installs are process-wide, so each rank needs a
process of its own, but not an interpreter of its own. At most one per core runs at a time."""

# Imports inside functions: importing a submodule runs this package's __init__, which must not load
# torch and the runtime before `python -m container`'s usage check.
from __future__ import annotations

import os
import sys
import warnings


def main() -> int:
    """Read the requests on standard input (a JSON line each), print a result line per request in
    their order; 0 every rank traced (or not traced, with why), 1 a trace failed (its result's `error`
    says where, or `exit` is the code of a forked trace that ended without a result)."""
    from container.uncollected import uncollected

    with uncollected():  # the runtime imported once, for this process's traces and those it forks
        from container.trace.step import trace_rank
    from launcher.wire.trace_record import TraceRequest, result_line

    requests = [TraceRequest.from_json(line) for line in sys.stdin.read().splitlines() if line.strip()]
    warnings.filterwarnings("ignore")  # torch's warnings about the fake group are not the job's
    results = [trace_rank(requests[0])] if len(requests) == 1 else _forked(requests, trace_rank, result_line)
    for result in results:
        print(result_line(result), flush=True)
    return 1 if any("error" in r or "exit" in r for r in results) else 0


def _forked(requests, trace_rank, result_line) -> list[dict]:
    """Each request traced in a child forked from this process, os.cpu_count() of them at a time;
    each child's result read from its pipe as it comes (a result may be larger than a pipe holds)."""
    import selectors

    from launcher.wire.trace_record import read_result

    results: list[dict | None] = [None] * len(requests)
    chosen = selectors.DefaultSelector()
    pending = list(enumerate(requests))
    while pending or chosen.get_map():
        while pending and len(chosen.get_map()) < (os.cpu_count() or 1):
            index, request = pending.pop(0)
            pid, pipe = _fork(request, trace_rank, result_line)
            chosen.register(pipe, selectors.EVENT_READ, (index, pid, []))
        for key, _ in chosen.select():
            index, pid, chunks = key.data
            chunk = os.read(key.fd, 1 << 16)
            if chunk:
                chunks.append(chunk)
                continue
            chosen.unregister(key.fd)
            os.close(key.fd)
            code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            found = read_result(b"".join(chunks).decode())
            results[index] = found if found is not None else {"rank": requests[index].rank, "exit": code or 1}
    return results


def _fork(request, trace_rank, result_line) -> tuple[int, int]:
    """A child tracing `request`: its pid and the read end of the pipe its result line comes on."""
    read, write = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: trace, hand the result line over, leave without the parent's cleanup
        code = 1
        try:
            os.close(read)
            with os.fdopen(write, "w") as out:
                out.write(result_line(trace_rank(request)) + "\n")
            code = 0
        except BaseException:  # noqa: BLE001 - reported as a program's uncaught exception would be
            import traceback

            traceback.print_exc()
        finally:
            sys.stderr.flush()
            os._exit(code)
    os.close(write)
    return pid, read
