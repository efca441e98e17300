"""Goodput before launch: how much of a job's wall time trains, given a failure rate, what a
checkpoint costs and what a restart costs; and the checkpoint interval that maximises it
(docs/faults.md, "Goodput").

The model (Young, "A first order approximation to the optimum checkpoint interval", Communications
of the ACM 17(9), 1974, with the saves' share of the wall time exact):

    MTBF M                 = 1 / (failure rate per GPU-hour x GPUs)
    fraction lost          = C / (τ + C) + (τ / 2 + lag + R) / M
    optimum interval τ*    = sqrt(2 x C x M)                       (Young's)

with C the training stalled by one save, τ the training time between saves, R a restart (start-up,
the checkpoint's load and verification) and lag the time a save's asynchronous write keeps the
newest *committed* checkpoint behind the save (0 for a synchronous save). A save every τ of
training takes C / (τ + C) of the wall time; Young's first order writes it C / τ, which is the same
where C << τ and passes 100% where a save outlasts the training between saves, so the exact share is
used (Young's τ* is the first-order optimum all the same: the exact share moves it by one save C,
which is below one step wherever C << τ*). A job that never
checkpoints restarts from step 0: its expected wall time for T of training is
(M + R)(e^(T/M) - 1) (failures arrive as a Poisson process; the renewal argument is in
docs/faults.md), so its goodput is T over that.

A job with min_instance_count M < N hosts goes on with fewer hosts when one is gone for good with no
spare (docs/faults.md, "Shrink and go on"): its steps after the j-th such loss take N / (N - j) as
long (the global batch is kept by gradient accumulation). The plan prices the bound where each of the
first N - M interruptions is such a loss: the run trains (1 + s) times as long, s its expected slowdown
(`shrink_slowdown`), and every goodput with checkpoints is divided by 1 + s. The host-hours, and so the
cost, stay the same: fewer hosts for longer.

Pure arithmetic on a plan's job, speed and memory: no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import accumulate

from launcher.config import ValidatedJob
from launcher.plan.host_staging import STAGED_TERMS
from launcher.plan.memory import MemoryEstimate
from launcher.plan.throughput import ThroughputEstimate
from launcher.wire.training.speed import is_async

# Meta, "The Llama 3 Herd of Models" (arXiv:2407.21783, 2024), section 3.3.4: 419 unexpected
# interruptions in a 54-day snapshot of pre-training on 16,384 H100 GPUs.
LLAMA3_INTERRUPTIONS, LLAMA3_DAYS, LLAMA3_GPUS = 419, 54, 16_384
DEFAULT_FAILURE_RATE = LLAMA3_INTERRUPTIONS / (LLAMA3_DAYS * 24 * LLAMA3_GPUS)  # per GPU-hour: 1.97e-5
FAILURE_RATE_SOURCE = (f"Llama 3: {LLAMA3_INTERRUPTIONS} unexpected interruptions in {LLAMA3_DAYS} days on "
                       f"{LLAMA3_GPUS:,} GPUs")

# Assumptions, each an option or a measurement (docs/faults.md says which):
DEFAULT_WRITE_GB_S = 1.0  # one host's checkpoint write (and read) bandwidth, GB/s: an assumption
HASH_S_PER_GIB = 0.75  # a rank's sha256 of what it wrote, read back (BENCHMARKS.md, bench/checkpoint_verify.py)
STAGING_S_PER_GIB = 0.5  # an asynchronous save's stall: the copy into host memory (BENCHMARKS.md, issue 32)
STARTUP_S = 60.0  # a restart's processes, imports, process groups and model: an assumption

_STATE = {"adamw": "fp32 weights + AdamW moments", "anyprecision": "fp32 weights + AnyPrecisionAdamW state"}


def mtbf_hours(failure_rate: float, gpus: int) -> float:
    """The job's mean time between failures: one failure per 1/(rate x GPUs) hours."""
    return 1.0 / (failure_rate * gpus)


def young_interval(checkpoint_s: float, mtbf_s: float) -> float:
    """Young's optimum training time between checkpoints, seconds: sqrt(2 C M)."""
    return math.sqrt(2.0 * checkpoint_s * mtbf_s)


def lost_fraction(interval_s: float, checkpoint_s: float, restart_s: float, mtbf_s: float, lag_s: float = 0.0) -> float:
    """The saves' share of the wall time, C/(τ + C), and per failure (first order) half an interval
    of training redone, the lag of the newest committed checkpoint and the restart, (τ/2 + lag + R)/M."""
    return checkpoint_s / (interval_s + checkpoint_s) + (interval_s / 2.0 + lag_s + restart_s) / mtbf_s


def shrink_slowdown(hosts: int, min_hosts: int, interruptions: float) -> float:
    """The expected share of its training time a run of `hosts` adds on fewer hosts, where each of its first
    hosts - min_hosts interruptions loses a host for good (`interruptions` expected over the run). They are a
    Poisson process in the run's work: a host fewer fails less often but trains as much slower, so their rate
    per step stays the same. Given k of them, the j-th falls with (k - j + 1)/(k + 1) of the work left (the
    uniform order statistics), which then takes hosts/(hosts - j) - hosts/(hosts - j + 1) longer."""
    most = hosts - min_hosts
    if most <= 0 or interruptions <= 0:
        return 0.0
    longer = [hosts / (hosts - j) - hosts / (hosts - j + 1) for j in range(1, most + 1)]
    # (k - j + 1)/(k + 1) = 1 - j/(k + 1): the sum over j <= J from two running sums
    plain, weighted = list(accumulate(longer)), list(accumulate(j * d for j, d in enumerate(longer, 1)))
    spread = 12 * math.sqrt(interruptions) + 30  # the Poisson terms beyond it are below 1e-30
    total = 0.0
    for k in range(max(1, int(interruptions - spread)), int(interruptions + spread) + 1):
        chance = math.exp(k * math.log(interruptions) - interruptions - math.lgamma(k + 1))
        last = min(k, most) - 1
        total += chance * (plain[last] - weighted[last] / (k + 1))
    return total


def goodput_from_step_zero(run_s: float, restart_s: float, mtbf_s: float) -> float:
    """Goodput of a run of `run_s` training seconds that restarts from its beginning after every
    failure: run / ((M + R)(e^(run/M) - 1)); 0 where that is below what a float holds."""
    x = run_s / mtbf_s
    if x > 700:  # e^x overflows a float: the run essentially never finishes
        return 0.0
    return x / ((1.0 + restart_s / mtbf_s) * math.expm1(x))


@dataclass(frozen=True)
class GoodputPlan:
    failure_rate: float  # interruptions per GPU-hour
    gpus: int
    step_s: float  # the predicted step time
    state_gib: float  # what one rank's checkpoint holds
    state: str  # what that is
    ranks_per_host: int
    replicas: int  # dp_replicate: DCP writes each replicated shard once, spread over its replicas
    write_gb_s: float  # per host
    asynchronous: bool
    max_steps: int | None
    checkpoint_freq: int | None  # the job's; None: it saves none (or, for a script, unknown)
    script: bool  # a user's script: its checkpoints are its own
    max_restarts: int = 0  # the job's automatic restarts (docs/faults.md, "Automatic restarts")
    hosts: int = 1  # instance_count
    min_hosts: int = 0  # min_instance_count: the job goes on down to this many hosts (0: it does not)

    # --- the costs --------------------------------------------------------------------------
    @property
    def mtbf_s(self) -> float:
        return mtbf_hours(self.failure_rate, self.gpus) * 3600.0

    @property
    def written_gib(self) -> float:
        """What one rank writes: its state, less the replicas' share DCP's deduplication gives them."""
        return self.state_gib / self.replicas

    @property
    def write_s(self) -> float:
        """A host's ranks write to one disk at once: the host's bytes over its bandwidth."""
        return self.written_gib * 2**30 * self.ranks_per_host / (self.write_gb_s * 1e9)

    @property
    def load_s(self) -> float:
        """At a restart every rank reads its whole state, replicas too."""
        return self.state_gib * 2**30 * self.ranks_per_host / (self.write_gb_s * 1e9)

    @property
    def hash_s(self) -> float:
        """Each rank hashes what it wrote, the ranks at once; a resume spreads the same hashing
        over the ranks."""
        return self.written_gib * HASH_S_PER_GIB

    @property
    def checkpoint_s(self) -> float:
        """C: the training stalled by a save (asynchronous: the copy into host memory)."""
        return self.state_gib * STAGING_S_PER_GIB if self.asynchronous else self.write_s + self.hash_s

    @property
    def lag_s(self) -> float:
        """An asynchronous save commits after its background write and hashing."""
        return self.write_s + self.hash_s if self.asynchronous else 0.0

    @property
    def restart_s(self) -> float:
        """R: start-up, reading the checkpoint back at the write bandwidth, and its verification
        (the hashing is spread over the ranks: each hashes about its own share)."""
        return STARTUP_S + self.load_s + self.hash_s

    # --- the answers ------------------------------------------------------------------------
    @property
    def optimum_s(self) -> float:
        return young_interval(self.checkpoint_s, self.mtbf_s)

    @property
    def optimum_steps(self) -> int:
        return max(1, round(self.optimum_s / self.step_s))

    @property
    def slowdown(self) -> float:
        """The share of its training time the run adds on fewer hosts after shrinks (shrink_slowdown); 0 for a
        job that does not shrink or has no run length."""
        if not self.min_hosts or self.expected_failures is None:
            return 0.0
        return shrink_slowdown(self.hosts, self.min_hosts, self.expected_failures)

    def goodput_every(self, steps: int) -> float:
        """Expected goodput saving every `steps` steps (the slower steps after shrinks priced)."""
        lost = lost_fraction(steps * self.step_s, self.checkpoint_s, self.restart_s, self.mtbf_s, self.lag_s)
        return max(0.0, 1.0 - lost) / (1.0 + self.slowdown)

    @property
    def goodput_without_checkpoints(self) -> float | None:
        """Every failure restarts from step 0 (start-up only: nothing to load); None without a
        run length (a script that does not say max_steps)."""
        if self.max_steps is None:
            return None
        return goodput_from_step_zero(self.max_steps * self.step_s, STARTUP_S, self.mtbf_s)

    @property
    def goodput_of_job(self) -> float | None:
        """At the job's own checkpoint_freq, or from step 0 where it saves none; None for a script."""
        if self.script:
            return None
        return self.goodput_every(self.checkpoint_freq) if self.checkpoint_freq else self.goodput_without_checkpoints

    def text(self) -> str:
        mtbf_h = self.mtbf_s / 3600
        lines = [f"goodput: {self.gpus:,} GPUs at {self.failure_rate:.3g} interruptions per GPU-hour "
                 f"({FAILURE_RATE_SOURCE if self.failure_rate == DEFAULT_FAILURE_RATE else '--failure-rate'}): "
                 f"MTBF {_hours(mtbf_h)}"]
        replicas = f", written once over {self.replicas} replicas" if self.replicas > 1 else ""
        held = (f"{self.state_gib:.2f} GiB per rank ({self.state}{replicas}) x {self.ranks_per_host} ranks per host "
                f"at {self.write_gb_s:g} GB/s per host")
        if self.asynchronous:
            lines.append(f"  checkpoint save (asynchronous): {held}: stalls training {self.checkpoint_s:.1f} s "
                         f"(the copy into host memory), committed {self.lag_s:.1f} s later")
        else:
            lines.append(f"  checkpoint save: {held} = {self.write_s:.1f} s write + {self.hash_s:.1f} s hashing = "
                         f"{self.checkpoint_s:.1f} s")
        restart = (f"  restart: {STARTUP_S:.0f} s start-up + {self.load_s:.1f} s load + {self.hash_s:.1f} s "
                   f"verification = {self.restart_s:.1f} s")
        if not self.script and not self.checkpoint_freq:
            restart += f" (with checkpoints; without: {STARTUP_S:.0f} s start-up, from step 0)"
        lines.append(restart)
        longer = (f", longer than the run ({self.max_steps:,} steps)"
                  if self.max_steps and self.optimum_steps > self.max_steps else "")
        lines.append(f"  optimum checkpoint interval (Young: sqrt(2 x {self.checkpoint_s:.1f} s x MTBF)): "
                     f"{_duration(self.optimum_s)} = {self.optimum_steps:,} steps of {self.step_s:.3g} s{longer}")
        if self.slowdown:
            lines.append("  " + self._shrink_text())
        lost = "lost = C/(interval + C) + (interval/2 + R)/MTBF" + (", then / (1 + slowdown)" if self.slowdown else "")
        lines.append(f"  expected goodput ({lost}): " + self._verdict())
        if self.max_steps:
            lines.append("  " + self._restarts_text())
        return "\n".join(lines)

    @property
    def expected_failures(self) -> float | None:
        """Interruptions expected over the run's training time (failures a Poisson process)."""
        return self.max_steps * self.step_s / self.mtbf_s if self.max_steps else None

    @property
    def unattended(self) -> float | None:
        """The probability that the run meets at most max_restarts interruptions: that it ends
        without a person (Poisson: sum of e^-L L^k / k! for k <= max_restarts)."""
        expected = self.expected_failures
        if expected is None:
            return None
        return sum(math.exp(-expected) * expected ** k / math.factorial(k) for k in range(self.max_restarts + 1))

    def _restarts_text(self) -> str:
        head = (f"interruptions over the run ({_duration(self.max_steps * self.step_s)} of training): "
                f"{self.expected_failures:.3g} expected; ")
        if not self.max_restarts:
            return head + (f"max_restarts 0: the first one ends the job (none comes with probability "
                           f"{_pct(self.unattended)}; set max_restarts to restart from the newest checkpoint)")
        return head + (f"max_restarts {self.max_restarts}: the job ends without a person's help with probability "
                       f"{_pct(self.unattended)} (at most {self.max_restarts} interruptions)")

    def _shrink_text(self) -> str:
        n, m = self.hosts, self.min_hosts
        return (f"after shrinks (min_instance_count {m} of {n} hosts): +{_pct(self.slowdown)} of training time "
                f"expected, if each of the first {n - m} interruption(s) loses its host for good with no spare (after "
                f"the j-th a step takes {n}/({n} - j) as long: the global batch kept); the same host-hours, so the "
                "same cost")

    def _verdict(self) -> str:
        best = f"{_pct(self.goodput_every(self.optimum_steps))} at the optimum"
        scratch = self.goodput_without_checkpoints
        if self.script:
            without = "" if scratch is None else f"; {_pct(scratch)} if it saves none (restarts from step 0)"
            return (f"{best}, if your script saves that often and resumes from its newest checkpoint (the planner "
                    f"does not know your script's checkpoints; their size is modeled as the state above){without}")
        if self.checkpoint_freq:
            interval = self.checkpoint_freq * self.step_s
            costly = (" (a save stalls training longer than it trains between saves: a larger checkpoint_freq "
                      "trains more)" if self.checkpoint_s >= interval else "")
            return (f"{_pct(self.goodput_every(self.checkpoint_freq))} at checkpoint_freq {self.checkpoint_freq:,} "
                    f"({_duration(interval)} between saves){costly}, {best}")
        return f"{_pct(scratch)} without checkpoint_freq (every failure restarts from step 0), {best}"

    def to_dict(self) -> dict:
        return {
            "failure_rate_per_gpu_hour": self.failure_rate,
            "gpus": self.gpus,
            "mtbf_hours": self.mtbf_s / 3600,
            "checkpoint_gib_per_rank": round(self.state_gib, 4),
            "write_gb_s_per_host": self.write_gb_s,
            "replicas": self.replicas,
            "write_s": round(self.write_s, 3),
            "load_s": round(self.load_s, 3),
            "checkpoint_s": round(self.checkpoint_s, 3),
            "checkpoint_lag_s": round(self.lag_s, 3),
            "restart_s": round(self.restart_s, 3),
            "optimum_interval_s": round(self.optimum_s, 3),
            "optimum_interval_steps": self.optimum_steps,
            "goodput_at_optimum": self.goodput_every(self.optimum_steps),
            "checkpoint_freq": self.checkpoint_freq,
            "goodput_at_checkpoint_freq": self.goodput_every(self.checkpoint_freq) if self.checkpoint_freq else None,
            "goodput_without_checkpoints": self.goodput_without_checkpoints,
            "goodput_of_job": self.goodput_of_job,
            "max_restarts": self.max_restarts,
            "expected_interruptions": self.expected_failures,
            "probability_unattended": self.unattended,
            "min_instance_count": self.min_hosts or None,
            "shrink_slowdown": self.slowdown,
            "formula": "Young (1974), the saves' share of the wall time exact",
            "models": "a script's own checkpoints are unknown" if self.script else "smlaunch's runtime checkpoints",
        }


def plan_goodput(job: ValidatedJob | None, speed: ThroughputEstimate | None, memory: MemoryEstimate | None,
                 failure_rate: float = DEFAULT_FAILURE_RATE,
                 write_gb_s: float = DEFAULT_WRITE_GB_S) -> GoodputPlan | None:
    """The goodput plan of a planned configuration (a PlanResult's job, throughput and memory); None
    where it has no step time (invalid, a local job, a script without its model, an accelerator
    without a throughput model)."""
    if job is None or speed is None or memory is None or job.layout is None or not job.processes_per_host:
        return None
    s, hp = job.settings, job.config.hyperparameters
    script = not job.kind.runtime
    return GoodputPlan(
        failure_rate=failure_rate, gpus=job.layout.world, step_s=speed.step_s,
        state_gib=sum(memory.gib(key) for key in STAGED_TERMS), state=_STATE.get(s.optimizer, s.optimizer),
        ranks_per_host=job.processes_per_host, replicas=job.layout.dp_replicate, write_gb_s=write_gb_s,
        asynchronous=not script and is_async(hp.checkpoint_async_mode),
        # a script's max_steps is its own argument: a run length only where the job sets it
        max_steps=hp.max_steps if script else s.max_steps,
        checkpoint_freq=None if script else (s.checkpoint_freq or None), script=script,
        max_restarts=job.config.max_restarts, hosts=job.config.instance_count,
        min_hosts=job.config.min_instance_count or 0)


def _pct(x: float) -> str:
    return f"{x:.1%}"


def _hours(h: float) -> str:
    return f"{h:,.0f} h" if h >= 10 else f"{h:.2f} h"


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.1f} s"
