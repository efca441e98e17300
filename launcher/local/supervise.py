"""Follow a prepared local job to its end: logs, max_run, stop signals, artifacts, status.

One reader thread per host copies its output to `logs/<host>.log`, to the merged
`logs/job.log` (host-prefixed) and to the console (host-prefixed, colour per host). The job
fails as soon as one host fails: the others are stopped, since their collectives would only
wait for the missing ranks. SIGINT/SIGTERM (Ctrl-C, `smlaunch stop`) and `max_run` stop every
host the way SageMaker does: SIGTERM, which the bootstraps forward to the ranks so they can save
a checkpoint, then SIGKILL after a grace period. Before the hosts start, the runner builds the
job's Python environment for its requirements.txt where it has one (launcher.local.jobenv): a pip
failure fails the job there, and a stop or max_run ends the build. Whatever happens, the hosts' `model/` and
`output/data/` become `model.tar.gz` and `output.tar.gz` in `output_path`, and `job.json` gets
the outcome, the failure reason and the times.

No process outlives the job: when the hosts have ended, whatever still carries the job's mark
(launcher.local.leftovers: a rank orphaned by a killed torchrun, a script's helper process) is
killed; and should the supervisor itself die, its watchdog (launcher.local.watchdog) stops the
job and records why.

`python -m launcher.local.supervise JOB_DIR` runs a prepared job detached (`submit --no-wait`).
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

# Imports inside functions: a runner's module (docker, Slurm) loads when a job uses it.
from launcher.local import artifacts, identity, leftovers, restarts, shrink, store
from launcher.local.jobenv import RequirementsFailed, SetupStopped
from launcher.local.logfile import LogFile
from launcher.local.spec import STOP_REQUEST, HostProcess, LocalJobSpec, Runner, stop_reason
from launcher.local.watchdog import Watchdog
from launcher.wire.opt_ml import FAILURE_LIMIT, failure_headline, scratch_dir
from launcher.wire.terminal import printable

STOP_GRACE_S = 120.0  # SageMaker's time between SIGTERM and SIGKILL when it stops a job
FAILED_HOST_GRACE_S = 10.0  # other hosts get this long to notice a failed host and exit by themselves
COLORS = ("cyan", "magenta", "green", "yellow", "blue", "red")
_ANSI = {"cyan": 36, "magenta": 35, "green": 32, "yellow": 33, "blue": 34, "red": 31}

Printer = Callable[[str, str, str], None]  # (label, color, line)


def console_printer(label: str, color: str, line: str) -> None:
    """`algo-1 | line`, the prefix in the host's colour when stdout is a terminal."""
    prefix = f"{label} |"
    if sys.stdout.isatty() and not os.environ.get("NO_COLOR"):
        prefix = f"\x1b[{_ANSI[color]}m{prefix}\x1b[0m"
    sys.stdout.write(f"{prefix} {printable(line)}\n")  # the job's output: no terminal control but colour
    sys.stdout.flush()


def runner_named(name: str, settings: dict | None = None) -> Runner:
    """The runner of that name; `settings` are the Slurm runner's (the job's slurm section)."""
    if name == "process":
        from launcher.local.process import ProcessRunner

        return ProcessRunner()
    if name == "docker":
        from launcher.local.docker import DockerRunner

        return DockerRunner()
    if name == "slurm":
        from launcher.slurm.runner import SlurmRunner

        return SlurmRunner(settings)
    raise ValueError(f"runner {name!r}: use 'process' or 'docker'")


class Supervisor:
    def __init__(self, spec: LocalJobSpec, runner: Runner, printer: Printer | None = console_printer,
                 stop_grace_s: float = STOP_GRACE_S, adopt_orphans: bool = False):
        """`adopt_orphans`: this process runs nothing but the job (`smlaunch submit`, the detached
        supervisor), so it may be the subreaper of every descendant (launcher.local.leftovers)."""
        self.spec, self.runner, self.printer = spec, runner, printer
        self.adopt_orphans = adopt_orphans
        self._reaper: int | None = None  # this process's pid once it is the job's subreaper
        self._spare: frozenset[int] = frozenset()  # its children that are not the job's (the watchdog)
        self.stop_grace_s = stop_grace_s
        self.signals: list[int] = []
        self.start_error = ""
        self.gave_up = ""  # what FailureReason adds for a lost host not restarted: why, the earlier failures
        self.abandoned_by: int | None = None  # the supervisor whose job the watchdog finishes
        self._lock = threading.Lock()
        self._merged: LogFile | None = None
        self.log_error: LogFile | None = None  # the first log that could not be written (a full disk)
        self._host_report: tuple[str, str] | None = None  # (host, FailureReason) read from its output/failure

    # --- output ---------------------------------------------------------------------------
    def _pump(self, host: HostProcess, color: str) -> None:
        own = LogFile(self.spec.job_dir / "logs" / f"{host.label}.log")
        try:
            for raw in iter(host.proc.stdout.readline, b""):  # read to the end whatever the disk does
                own.write(raw)
                self._check_disk(own)
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                with self._lock:
                    self._merged.write(f"{host.label} | {line}\n".encode())
                    if self.printer:
                        self.printer(host.label, color, line)
                self._check_disk(self._merged)
        finally:
            own.close()
            host.proc.stdout.close()

    def _note(self, line: str) -> None:
        with self._lock:
            self._merged.write(f"smlaunch | {line}\n".encode())
            if self.printer:
                self.printer("smlaunch", "yellow", line)

    def _check_disk(self, log: LogFile) -> None:
        """The first log that cannot be written fails the job (said once): its disk holds the hosts'
        /opt/ml too, so the job could not save its model or checkpoints there either."""
        if log.error is None or self.log_error is not None:
            return
        with self._lock:
            if self.log_error is not None:
                return
            self.log_error = log
        self._note(f"cannot write {log.path}: {log.error.strerror}; log output is dropped from here on "
                   "and the job is stopped")

    # --- signals --------------------------------------------------------------------------
    def _on_signal(self, signum: int, _frame) -> None:
        self.signals.append(signum)

    def _install_handlers(self) -> dict:
        if threading.current_thread() is not threading.main_thread():
            return {}
        return {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}

    def _signal_all(self, hosts: list[HostProcess], signum: int) -> None:
        if hosts:
            self.runner.signal_hosts(hosts, signum)

    def _stop_requested(self) -> bool:
        """A stop asked for through the job directory (`smlaunch stop` of a job on other machines)."""
        return (self.spec.job_dir / STOP_REQUEST).exists()

    # --- the run --------------------------------------------------------------------------
    def run(self) -> dict:
        """Run the job to its end; returns the final record. Raises KeyboardInterrupt after a
        Ctrl-C, once every host is stopped and the outcome is recorded."""
        (self.spec.job_dir / "logs").mkdir(exist_ok=True)
        watchdog = Watchdog(self.spec.job_dir)
        if self.adopt_orphans and leftovers.become_subreaper():
            self._reaper, self._spare = os.getpid(), frozenset({watchdog.proc.pid})
        self._merged = LogFile(self.spec.job_dir / "logs" / "job.log")
        try:
            self._check_disk(self._merged)
            reason, record = self._run(watchdog.proc.pid)
        finally:
            self._merged.close()
            watchdog.release()
        if reason == "interrupted":
            raise KeyboardInterrupt
        return record

    def _run(self, watchdog_pid: int) -> tuple[str | None, dict]:
        spec = self.spec
        previous = self._install_handlers()
        started = time.monotonic()
        self._update(SecondaryStatus="Training", SupervisorPid=os.getpid(), WatchdogPid=watchdog_pid,
                     SupervisorProcess=identity.of(os.getpid()), WatchdogProcess=identity.of(watchdog_pid),
                     TrainingStartTime=store.now(),
                     StatusMessage=f"{len(spec.hosts)} host(s) x {spec.processes_per_host} process(es), "
                                   f"{spec.runner} runner")
        hosts: list[HostProcess] = []
        every: list[HostProcess] = []
        pumps: list[threading.Thread] = []
        reason, exits = None, []  # why we stopped the hosts; (label, code) in the order they ended
        try:
            try:
                self._setup(started)
                hosts = self.runner.start(spec)
            except SetupStopped:
                reason = self._stop_reason(started)
                self._note(f"{reason.replace('_', ' ')} while the job's environment was being built: "
                           "no host was started")
            except RequirementsFailed as exc:
                reason, self.start_error = "requirements_failed", str(exc)
            except Exception as exc:  # noqa: BLE001 - a job that cannot start must still end in its record
                self._note(f"could not start the hosts: {exc}")
                reason, self.start_error = "start_failed", f"{type(exc).__name__}: {exc}"
            every = list(hosts)  # each host process this run started (a restart starts them again)
            while True:
                pumps += self._start_pumps(hosts)
                reason, exits = self._follow(hosts, started, reason)
                if not self._restart_after_loss(reason, exits):
                    break
                hosts = self.runner.start(spec)
                every += hosts
                reason = None
        finally:
            self._signal_all(every, signal.SIGKILL)  # only if something above raised
            for host in every:
                host.proc.wait()
            for pump in pumps:
                pump.join(timeout=5)
            self._hosts_ended()
            self._end_leftovers()
            try:
                self.runner.cleanup(spec)
            finally:
                for signum, handler in previous.items():
                    signal.signal(signum, handler)
        return reason, self._finish(reason, exits, time.monotonic() - started)

    def _start_pumps(self, hosts: list[HostProcess]) -> list[threading.Thread]:
        pumps = [threading.Thread(target=self._pump, args=(host, COLORS[i % len(COLORS)]), daemon=True)
                 for i, host in enumerate(hosts)]
        for pump in pumps:
            pump.start()
        return pumps

    def _follow(self, hosts: list[HostProcess], started: float, reason: str | None) -> tuple[str | None, list]:
        """Until every host has ended: stop them all on a signal, a stop request, a full disk,
        max_run or the first failed host. Returns (why they were stopped, (label, code) in the
        order they ended)."""
        spec = self.spec
        exits: list[tuple[str, int]] = []
        kill_at = None
        while True:
            for host in hosts:
                code = host.proc.poll()
                if code is not None and host.label not in dict(exits):
                    exits.append((host.label, self._exit_code(host.label, code)))
            if len(exits) == len(hosts):
                break
            now = time.monotonic()
            if reason is None:
                failed = [label for label, code in exits if code != 0]
                if not self.signals and self._stop_requested():
                    self.signals.append(signal.SIGTERM)
                if self.signals:
                    reason = "interrupted" if self.signals[0] == signal.SIGINT else "stopped"
                    self._note(f"{signal.Signals(self.signals[0]).name}: stopping every host "
                               f"(SIGKILL in {self.stop_grace_s:.0f} s; again to kill now)")
                    self._signal_all(hosts, signal.SIGTERM)
                    kill_at = now + self.stop_grace_s
                elif self.log_error is not None:
                    reason = "disk_full"
                    self._signal_all(hosts, signal.SIGTERM)
                    kill_at = now + self.stop_grace_s
                elif now - started > spec.max_run:
                    reason = "max_run"
                    self._note(f"max_run ({spec.max_run} s) exceeded: stopping every host")
                    self._signal_all(hosts, signal.SIGTERM)
                    kill_at = now + self.stop_grace_s
                elif failed:
                    reason = "host_failed"
                    if restarts.restartable(self.spec, exits):  # its peers wait for it in vain: stop them now
                        kill_at = now
                    else:
                        kill_at = now + FAILED_HOST_GRACE_S
                        self._failed_early(exits)
            elif reason == "host_failed" and kill_at is not None and now >= kill_at:
                self._note(f"{exits[0][0]} failed: stopping the other hosts")
                self._signal_all(hosts, signal.SIGTERM)
                reason, kill_at = "host_failed_stopping", now + self.stop_grace_s
            elif kill_at is not None and (now >= kill_at or len(self.signals) > 1):
                self._signal_all(hosts, signal.SIGKILL)
                kill_at = None
            time.sleep(0.1)
        return reason, exits

    def _exit_code(self, label: str, code: int) -> int:
        """The host's exit code as its runner reads it (Slurm: srun's 0 for a step whose node failed)."""
        read = getattr(self.runner, "exit_code", None)
        return read(self.spec, label, code) if read else code

    def _restart_after_loss(self, reason: str | None, exits: list[tuple[str, int]]) -> bool:
        """A host whose processes are gone (launcher.local.restarts.lost_host) is what its own
        bootstrap cannot restart: unless it was lost where it was the attempt before (the repeat rule)
        and while restarts are left (max_restarts, counted over the whole job), start every host again
        at the next attempt; they resume from the newest verified checkpoint. The runner first says
        where the lost host runs now (Slurm: a spare node) or why it cannot run: then the job goes on
        with the hosts left where min_instance_count allows (launcher.local.shrink), else it ends."""
        # None: every host ended before the supervisor stopped any (a job of one host)
        if reason not in (None, "host_failed", "host_failed_stopping") or not self.spec.max_restarts:
            return False
        lost = restarts.lost_host(self.spec, exits)
        if lost is None:
            return False
        attempt = restarts.next_attempt(self.spec)
        failure_class, why = restarts.judge_loss(self.spec, lost[0], attempt - 1)
        where, gone = "", None
        if why is None and hasattr(self.runner, "host_lost"):
            try:
                where = self.runner.host_lost(self.spec, lost[0])
            except Exception as exc:  # noqa: BLE001 - no place to run the host: go on without it, or end
                gone = str(exc)
                why = None if shrink.allowed(self.spec) else f"not restarted: {exc}{shrink.too_few(self.spec)}"
        if why:
            self.gave_up = restarts.earlier_failures(self.spec, attempt - 1, why)
        record = restarts.record_loss(self.spec, *lost, attempt=attempt - 1, restarted=why is None,
                                      failure_class=failure_class,
                                      hosts_left=len(self.spec.hosts) - 1 if gone is not None and not why else None)
        if why:
            self._note(f"{record.reason}; {why}")
            return False
        number = restarts.counted_before(self.spec, attempt)  # this one among them
        on = "every host"
        if gone is not None:
            entry = shrink.go_on_without(self.spec, lost[0], record.step, attempt - 1)
            where, on = gone, f"the {entry['to']} host(s) left"
        self._note(f"{record.reason}: restarting the job on {on} (restart {number} of "
                   f"{self.spec.max_restarts}, max_restarts){'; ' + where if where else ''}; it resumes from "
                   "its newest verified checkpoint")
        self.spec.attempt = attempt
        self._update(TrainingJobStatus="InProgress", SecondaryStatus="Training",
                     StatusMessage=f"restart {number} of {self.spec.max_restarts}: {record.reason}")
        return True

    def _failed_early(self, exits: list[tuple[str, int]]) -> None:
        """The job has failed once its first host has: say so now, not after the other hosts are
        stopped (a frozen one may take the whole grace). TrainingEndTime comes with the outcome,
        once every host has ended and the artifacts are packed."""
        self._update(TrainingJobStatus="Failed", SecondaryStatus="Stopping", FailureReason=self._failure_reason(exits),
                     StatusMessage=f"{exits[-1][0]} failed: stopping the other hosts")

    def _hosts_ended(self) -> None:
        """The runner ends what it ran beside the hosts (no process the job left: _end_leftovers)."""
        hosts_ended = getattr(self.runner, "hosts_ended", None)  # a runner of the Runner protocol before it had one
        if hosts_ended is not None:
            hosts_ended(self.spec)

    def _setup(self, started: float) -> None:
        """The runner's work before any host starts (the job's environment for its requirements.txt),
        stopped by what stops a running job: a signal, a stop request, max_run."""
        setup = getattr(self.runner, "setup", None)  # a runner of the Runner protocol before it had one
        if setup is None:
            return
        record = setup(self.spec, self._note, lambda: self._stop_reason(started) is not None)
        if record:
            self._update(JobEnvironment=record)

    def _stop_reason(self, started: float) -> str | None:
        if not self.signals and self._stop_requested():
            self.signals.append(signal.SIGTERM)
        if self.signals:
            return "interrupted" if self.signals[0] == signal.SIGINT else "stopped"
        return "max_run" if time.monotonic() - started > self.spec.max_run else None

    def _end_leftovers(self, grace_s: float = 0.0, what: str = "the job left behind") -> None:
        ended = leftovers.end_job_processes(self.spec.job_dir, grace_s, ancestor=self._reaper, spare=self._spare)
        if ended:
            self._note(f"ended {len(ended)} process(es) {what}: " + "; ".join(ended))
        for host in self.spec.every_host():  # a host killed by SIGKILL left its ranks' raw output there
            shutil.rmtree(scratch_dir(self.spec.host_dir(host)), ignore_errors=True)

    def abandoned(self, supervisor_pid: int | None) -> dict:
        """The watchdog's part once the supervisor died without an outcome: stop every process of
        the job as a stop would (SIGTERM, SIGKILL after the grace period), then record why."""
        spec = self.spec
        (spec.job_dir / "logs").mkdir(exist_ok=True)
        self._merged = LogFile(spec.job_dir / "logs" / "job.log")
        try:
            self._note(f"the supervisor (pid {supervisor_pid}) ended without recording an outcome: "
                       "stopping every process of the job")
            self._end_leftovers(grace_s=self.stop_grace_s, what="still running")
            try:
                self.runner.cleanup(spec)
            except Exception as exc:  # noqa: BLE001 - the outcome must still be recorded
                self._note(f"could not release the runner's resources: {exc}")
            self.abandoned_by = supervisor_pid
            started = store.read(spec.name, spec.job_dir.parent).get("TrainingStartTime")
            return self._finish("supervisor_lost", [], _seconds_since(started))
        finally:
            self._merged.close()

    def _update(self, **fields) -> None:
        """A record update on the way (not the outcome): one the disk refuses is noted, not raised,
        so the job still runs to an outcome, which the record's reserve has room for."""
        try:
            store.update(self.spec.job_dir, **fields)
        except OSError as exc:
            self._note(f"could not update {self.spec.job_dir / store.RECORD}: {exc}")

    # --- the outcome ----------------------------------------------------------------------
    def _finish(self, reason: str | None, exits: list[tuple[str, int]], seconds: float) -> dict:
        spec = self.spec
        fields: dict = {"HostExitCodes": dict(exits), "TrainingTimeInSeconds": round(seconds)}
        if reason in ("interrupted", "stopped"):
            status, secondary, message = "Stopped", "Stopped", "Stopped by the user"
            if why := stop_reason(spec.job_dir):  # stopped by a sweep's early stopping, say
                message = fields["StopReason"] = why
        elif reason == "start_failed":
            status, secondary, message = "Failed", "Failed", "The hosts could not be started"
            fields["FailureReason"] = f"ClientError: {self.start_error}"[:FAILURE_LIMIT]
        elif reason == "requirements_failed":  # as the toolkit's failure file would say it on SageMaker
            status, secondary, message = "Failed", "Failed", "Installing requirements.txt failed"
            fields["FailureReason"] = f"AlgorithmError: {self.start_error}"[:FAILURE_LIMIT]
        elif reason == "supervisor_lost":
            status, secondary, message = "Failed", "Failed", "The supervisor ended without an outcome"
            fields["FailureReason"] = (
                f"ClientError: the local supervisor (pid {self.abandoned_by}) ended without recording an outcome "
                "(killed?); its watchdog stopped every process of the job")
        elif reason == "disk_full":
            status, secondary, message = "Failed", "Failed", "A log of the job could not be written"
            fields["FailureReason"] = self._disk_full_reason()
        elif reason == "max_run":
            status, secondary, message = "Stopped", "MaxRuntimeExceeded", f"Exceeded max_run ({spec.max_run} s)"
            fields["FailureReason"] = f"MaxRuntimeExceeded: the job ran longer than max_run ({spec.max_run} s)"
        elif exits and all(code == 0 for _, code in exits) and all(
                (spec.host_dir(h) / "output" / "success").exists() for h in spec.hosts):
            status, secondary, message = "Completed", "Completed", "Training job completed"
        else:
            status, secondary, message = "Failed", "Failed", "Training job failed"
            fields["FailureReason"] = self._failure_reason(exits)
        self._update(SecondaryStatus="Uploading", StatusMessage="Packing the artifacts")
        try:
            fields.update(artifacts.store(spec, with_model=status != "Failed", note=self._note))
        except Exception as exc:  # noqa: BLE001 - an upload failure must end in the record
            if reason != "disk_full":  # a full disk is the cause, the artifacts only one more victim
                status, secondary, message = "Failed", "Failed", "Uploading the artifacts failed"
                fields["FailureReason"] = f"ClientError: could not store the artifacts: {exc}"[:FAILURE_LIMIT]
            self._note(f"could not store the artifacts: {exc}")
        if status == "Failed" and "FailureReason" in fields:
            reason = fields["FailureReason"]
            if self._host_report and self._host_report[1] == reason:
                # the host's bootstrap printed that report when it wrote it: name it, do not repeat it
                self._note(f"failed: {failure_headline(reason)} (the report of {self._host_report[0]} above)")
            else:
                self._note(f"failed: {reason}")
        outcome = dict(TrainingJobStatus=status, SecondaryStatus=secondary, StatusMessage=message,
                       TrainingEndTime=store.now(), **fields)
        try:
            return store.update(spec.job_dir, outcome=True, **outcome)
        except OSError as exc:  # even the reserve did not do: say it where it can be seen
            print(f"smlaunch: could not record the outcome of {spec.name} ({status}: "
                  f"{fields.get('FailureReason', message)}) in {spec.job_dir / store.RECORD}: {exc}", file=sys.stderr)
            return store.merged(spec.job_dir, **outcome)

    def _disk_full_reason(self) -> str:
        log = self.log_error
        what = "no space left on device" if log.error.errno == errno.ENOSPC else log.error.strerror
        return (f"ClientError: {what}: could not write {log.path} ({log.error}); {log.dropped} bytes of log "
                "output were dropped and the job was stopped. Free space there (or set SMLAUNCH_HOME to a "
                "larger disk) and run the job again")[:FAILURE_LIMIT]

    def _failure_reason(self, exits: list[tuple[str, int]]) -> str:
        """The first host to fail, and its output/failure (the bootstrap's report) if it wrote one.

        Only the first: the other hosts' reports are the consequence (stopped after it failed).
        Without any failing host (every host exited 0 but one wrote no success file) the first
        host with a report is taken."""
        failed = [(label, code) for label, code in exits if code != 0]
        candidates = [label for label, _ in failed[:1]] or [label for label, _ in exits] or self.spec.hosts
        for label in candidates:
            failure = self.spec.job_dir / "hosts" / label / "output" / "failure"
            if failure.is_file() and failure.read_text(errors="replace").strip():
                text = failure.read_text(errors="replace").strip()
                reason = f"AlgorithmError: {label}: {text}"[:FAILURE_LIMIT]
                self._host_report = (label, reason)
                return reason
        what = f"{failed[0][0]} {restarts.ended(failed[0][1])} without a failure report" if failed else (
            "no host reported success")
        if self.gave_up:
            return f"AlgorithmError: {what}{self.gave_up}"[:FAILURE_LIMIT]
        return f"AlgorithmError: {what}; see logs/job.log"[:FAILURE_LIMIT]


def _seconds_since(iso: str | None) -> float:
    if not iso:
        return 0.0
    return max((datetime.now(timezone.utc) - datetime.fromisoformat(iso)).total_seconds(), 0.0)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m launcher.local.supervise JOB_DIR", file=sys.stderr)
        return 2
    spec = LocalJobSpec.load(Path(argv[0]))
    record = Supervisor(spec, runner_named(spec.runner, spec.runner_settings), printer=None, adopt_orphans=True).run()
    return 0 if record["TrainingJobStatus"] == "Completed" else 1


if __name__ == "__main__":
    sys.exit(main())
