"""Inspect many hosts at once: one SSH exec round trip per host, in parallel, each with a deadline.

A host that fails never stops the others; every target ends with a status:
``ok`` / ``partial`` (collected), ``unreachable``, ``auth_failed``, ``host_key_refused``,
``error`` (connected, but no usable answer: no python3, a bad probe answer).
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from kvforensics.agent.remote import probe as probe_mod
from kvforensics.agent.remote import stopping, transport
from kvforensics.agent.remote.outcome import ExecResult, SshError

DEFAULT_PARALLEL = 16
DEFAULT_TIMEOUT_S = 30.0
_NO_PYTHON = (b"python3: command not found", b"python3: not found", b"No such file or directory")


@dataclass(frozen=True)
class HostResult:
    """One SSH host's result in a fleet run: its snapshot, or the status and problem that stopped it; what it cost."""

    target: str
    status: str
    snapshot: Optional[Dict[str, Any]]
    problem: Optional[Tuple[str, str]] = None  # (code, message) when not collected
    stderr: str = ""
    notes: Tuple[str, ...] = ()
    bytes_sent: int = 0
    round_trips: int = 0
    duration_s: float = 0.0


@dataclass
class FleetOptions:
    """How a fleet run reaches its SSH hosts: probe options, ssh config, host keys, parallelism, a timeout per host."""

    probe_options: Dict[str, Any] = field(default_factory=dict)
    ssh_config: Optional[str] = None
    accept_new: bool = False
    parallel: int = DEFAULT_PARALLEL
    timeout_s: float = DEFAULT_TIMEOUT_S
    identity: Optional[str] = None  # --identity FILE: tried first, like ssh -i
    transport: str = "auto"  # agent/remote/transport.py CHOICES
    multiplex: bool = True  # OpenSSH: a shared master connection per host (ControlMaster)


def _no_python(result: ExecResult) -> bool:
    return result.exit_status == 127 or (result.exit_status != 0 and any(s in result.stderr for s in _NO_PYTHON)
                                         and b"python3" in result.stderr)


def _collect_one(target: str, way: transport.Transport, opts: FleetOptions, probe: probe_mod.Probe,
                 sent: Optional[threading.Event] = None) -> HostResult:
    start = time.monotonic()
    deadline = start + opts.timeout_s
    conn = None

    def done(status: str, snap: Optional[Dict[str, Any]], problem: Optional[Tuple[str, str]], stderr: str = "",
             result: Optional[ExecResult] = None, trips: int = 0) -> HostResult:
        return HostResult(target=target, status=status, snapshot=snap, problem=problem, stderr=stderr,
                          notes=tuple(conn.notes) if conn is not None else (),
                          bytes_sent=result.bytes_sent if result is not None else 0, round_trips=trips,
                          duration_s=time.monotonic() - start)

    try:
        conn = way.open(target, deadline)
        if sent is not None:
            sent.set()  # the probe is on its way (exec starts ssh at once, then waits without the GIL)
        result = conn.exec(probe_mod.REMOTE_COMMAND, probe.script, deadline)
        trips = 1
        if probe_mod.wants_lzma(result.stdout):  # a python3 built without lzma: the deflated probe, once more
            probe, first_sent = probe.without_lzma(), result.bytes_sent
            result = conn.exec(probe_mod.REMOTE_COMMAND, probe.script, deadline)
            result, trips = replace(result, bytes_sent=first_sent + result.bytes_sent), 2
        stderr = result.stderr.decode("utf-8", "replace")[-4000:]
        if _no_python(result):
            return done("error", None, ("probe.python_not_found",
                                        "{}: no python3 there (kvforensics needs only python3 >= 3.8 on the host; "
                                        "nothing is installed)".format(target)), stderr, result, trips)
        try:
            snap = probe_mod.parse_answer(result.stdout, probe)
        except probe_mod.ProbeError as exc:
            last = stderr.strip().splitlines()[-1] if stderr.strip() else "no stderr"
            return done("error", None, (exc.code, "{}: {} (exit {}; {})".format(
                target, exc.message, result.exit_status, last)), stderr, result, trips)
        return done("ok", snap, None, stderr, result, trips)
    except SshError as exc:
        message = exc.message
        if "deadline reached" in message:  # the same words for a probe cut off, whatever the transport
            message = "{}: no answer within {:g} s (--timeout): the probe was still running or the connection " \
                "hung".format(target, opts.timeout_s)
        return done(exc.status, None, ("ssh." + exc.status, message))
    except Exception as exc:  # noqa: BLE001 - one host's surprise must not end the sweep
        return done("error", None, ("ssh.error", "{}: {}: {}".format(target, type(exc).__name__, exc)))
    finally:
        if sent is not None:
            sent.set()
        if conn is not None:
            conn.close()


def run(targets: Sequence[str], opts: FleetOptions, on_done: Optional[Callable[[HostResult], None]] = None,
        while_waiting: Optional[Callable[[], None]] = None) -> List[HostResult]:
    """Every target's result, in the order given. ``while_waiting`` runs once, as soon as the first probe is on its
    way, in the ``Background``: work for the handshake's time (imports), never before a host's ssh has started,
    and done before the first ``on_done``. Interrupted (Ctrl-C or SIGTERM) or failing here, the sweep stops at
    once: no host is started after it, the sessions under way are ended (``Transport.abandon``), and it is raised
    again."""
    way = transport.choose(opts.transport, transport.Settings(
        ssh_config=opts.ssh_config, accept_new=opts.accept_new, identity=opts.identity, multiplex=opts.multiplex,
        interactive=len(targets) == 1 and sys.stdin.isatty()))
    probe = probe_mod.build(dict(opts.probe_options, time_limit_s=opts.timeout_s))
    results: Dict[int, HostResult] = {}
    sent = threading.Event()
    sweep = _Sweep(targets, lambda t: _collect_one(t, way, opts, probe, sent), max(1, min(opts.parallel,
                                                                                             len(targets))))
    warming = None
    with stopping.sigterm_interrupts(sweep.stopped):
        try:
            if while_waiting is not None:
                sent.wait()
                warming = Background(while_waiting)
            for index, res in sweep.completed():
                results[index] = res
                if warming is not None:  # what on_done uses is imported before it runs, as it was in one thread
                    warming.finish()
                    warming = None
                if on_done is not None:
                    on_done(res)
            if warming is not None:
                warming.finish()
        except BaseException:  # Ctrl-C, SIGTERM, a failure here: nothing more starts, what runs is ended
            sweep.stopped.set()
            way.abandon()
            raise
    return [results[i] for i in range(len(targets))]


class _Sweep(object):
    """``collect(target)`` for every target, ``workers`` at a time, on daemon threads; results as they complete.

    Not concurrent.futures: its pool joins every worker when the sweep ends, so a Ctrl-C waited for every host
    still queued (a 256-host sweep, to its end), and its import (logging with it) cost ~3 ms before the first
    ssh. ``collect`` returns a result for every failure of a host; what it raises ends the sweep."""

    def __init__(self, targets: Sequence[str], collect: Callable[[str], HostResult], workers: int) -> None:
        self._todo: "queue.SimpleQueue[Tuple[int, str]]" = queue.SimpleQueue()
        self._done: "queue.SimpleQueue[Tuple[int, Optional[HostResult], Optional[BaseException]]]" = \
            queue.SimpleQueue()
        self.stopped = threading.Event()  # set: no host is started after the one each worker has
        self._collect = collect
        self._count = len(targets)
        for item in enumerate(targets):
            self._todo.put(item)
        for n in range(workers):
            threading.Thread(target=self._work, name="kvforensics-host-{}".format(n), daemon=True).start()

    def _work(self) -> None:
        while not self.stopped.is_set():
            try:
                index, target = self._todo.get_nowait()
            except queue.Empty:
                return
            try:
                self._done.put((index, self._collect(target), None))
            except BaseException as exc:  # noqa: BLE001 - raised again in the sweep's thread, by completed()
                self._done.put((index, None, exc))

    def completed(self) -> Iterator[Tuple[int, HostResult]]:
        for _ in range(self._count):
            index, res, exc = self._done.get()
            if exc is not None:
                raise exc
            assert res is not None
            yield index, res


class Background(object):
    """``work()`` on a thread of its own at the lowest CPU priority (Linux: nice 19 for that thread alone), for
    work done ahead of need: while the handshakes run it yields the CPU to ssh, sshd and the probe where they
    share cores (one loopback host: 0.645 → 0.639 s, within the noise; meant for sweeps). ``finish`` waits for
    it and raises what it raised."""

    def __init__(self, work: Callable[[], None]) -> None:
        self._work = work
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, name="kvforensics-warm-up", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        if sys.platform.startswith("linux"):  # where PRIO_PROCESS of a thread id is that thread's own priority
            try:
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
            except OSError:
                pass
        try:
            self._work()
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread, by finish()
            self._error = exc

    def finish(self) -> None:
        self._thread.join()
        if self._error is not None:
            raise self._error


def progress_printer(total: int) -> Tuple[Callable[[HostResult], None], Callable[[], None]]:
    """A progress bar on stderr when it is a terminal; silent otherwise."""
    if not sys.stderr.isatty() or total < 2:
        return (lambda _r: None), (lambda: None)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    prog = Progress(TextColumn("inspecting"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("{task.fields[last]}"), console=Console(stderr=True), transient=True)
    task = prog.add_task("hosts", total=total, last="")
    prog.start()

    def done(r: HostResult) -> None:
        prog.update(task, advance=1, last="{} {}".format(r.target, r.status))

    return done, prog.stop
