"""The fork server's last preload (tests/support/forkserver.py): what the server imported is moved out
of the collector's reach (gc.freeze), as the runtime's agent does before it forks its ranks
(container/distributed/forked_ranks.py). A process forked from the server then collects its own
objects only: without it, the first full collection of a rank walked the ~330,000 objects of torch,
the runtime and the CLI (0.2 s of a 0.7 s rank of 6 steps; BENCHMARKS.md)."""

import gc

gc.freeze()
