"""A run that reaches other machines, told to stop: Ctrl-C, or SIGTERM (``timeout``, systemd, a pod's grace
period). Both end it the same way, as KeyboardInterrupt in the main thread, so that what it started (ssh, kubectl)
is ended and its temporary folders removed before it exits 130; SIGTERM's default would exit at once, leaving
them to finish on their own."""

from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Dict, Iterator

if TYPE_CHECKING:
    import subprocess

__all__ = ["OWN_PROCESS_GROUP", "Terminated", "kill_group", "sigterm_interrupts"]

# Popen's keywords for a child in a process group of its own: os.killpg then ends it and what it forked (ssh and its
# ProxyCommand, a kubectl wrapper's child), and the terminal's Ctrl-C reaches this process alone. A session of its
# own, today. Measured (2026-12-03, bench/RESULTS.md): with the kernel's scheduler autogroups (on by default) each
# session competes as one for the CPU, so 64 ssh clients in 64 sessions take 64 shares against one for all else on
# the machine; ``process_group=0`` (Python 3.11+, this process's session) made a 128-host loopback sweep 64 at a
# time 28 s instead of 44, but ~10 % of its hosts then answered nothing (ssh exit 0, its output cut after the
# session opened), which is not understood yet: kept out until it is.
OWN_PROCESS_GROUP: Dict[str, Any] = {"start_new_session": True}


def kill_group(proc: "subprocess.Popen[bytes]", signum: int = signal.SIGKILL) -> None:
    """``signum`` to a child started with OWN_PROCESS_GROUP and everything in its group; gone already is fine."""
    try:
        os.killpg(proc.pid, signum)
    except OSError:  # gone (ESRCH), or not ours to signal: in a cleanup, never a traceback
        pass


class Terminated(KeyboardInterrupt):
    """SIGTERM during a run: ended like Ctrl-C."""


@contextmanager
def sigterm_interrupts(stopping: threading.Event) -> Iterator[None]:
    """For the block, SIGTERM raises Terminated in the main thread, once: not after ``stopping`` is set (the run
    is ending), so a second SIGTERM cannot cut its cleanup short. Off the main thread nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum: int, frame: Any) -> None:
        if not stopping.is_set():
            raise Terminated()

    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
