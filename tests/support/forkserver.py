"""One fork server per test process, holding torch's heavy modules imported once: a rank it
starts is running in milliseconds, where a fresh interpreter spends ~3 s of CPU importing torch
(torchrun's agent another 1.4 s), most of the suite's multi-process time on 2 cores.

Preloaded are torch's modules, smlaunch's runtime as a rank of train.py or of a trace imports it
(~75 ms of CPU a rank, ~400 ranks a suite) and smlaunch's CLI as its commands import it
(tests/support/forked_cli.py): none of them reads the environment, the working directory or the
arguments when imported (smlaunch's runtime reads them when it runs, as its agents' preload in
production relies on: container/distributed/zygote.py). Modules that do read the environment at import
(huggingface_hub reads HF_HUB_OFFLINE and HF_HOME), and entrypoints/train.py (which puts its shipped
copy on sys.path), are imported by each rank, in the environment its test gives it. A rank that
replaces a runtime function to watch it (tests/support/counted_steps.py) replaces it in the module
that looks it up when it runs, so the preload changes nothing for it. The last preload
(tests/support/frozen.py) puts what the server imported out of its children's collections
(gc.freeze), as the runtime's agent does before it forks its ranks."""

from __future__ import annotations

import multiprocessing

PRELOAD = ["torch", "torch.distributed.fsdp", "torch.distributed.tensor", "torch.distributed.tensor.parallel",
           "torch.distributed.checkpoint", "torch.distributed.pipelining", "torch.nn.attention.bias",
           "torch.nn.attention.flex_attention",
           "container.args", "container.trainer", "container.distributed.runtime", "container.trace.step",
           # the CLI and what its commands import as they run (tests/support/forked_cli.py)
           "launcher.cli.app", "launcher.cli.jobs", "launcher.cli.metrics", "launcher.cli.jobview",
           "launcher.cli.metrics_view", "launcher.backends.local", "launcher.backends.live",
           "launcher.backends.registry", "launcher.config.jobfile", "launcher.local.supervise",
           "launcher.local.prepare", "launcher.local.process", "launcher.plan.report", "launcher.plan.fits",
           "launcher.tune.state", "botocore.exceptions",
           "tests.support.frozen"]  # last: it freezes what the ones before it imported


def start_method() -> str:
    """"forkserver", with PRELOAD as the server's imports (set before its first start)."""
    multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)
    return "forkserver"
