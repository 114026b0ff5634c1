"""A run that reaches other machines, told to stop: Ctrl-C, or SIGTERM (``timeout``, systemd, a pod's grace
period). Both end it the same way, as KeyboardInterrupt in the main thread, so that what it started (ssh, kubectl)
is ended and its temporary folders removed before it exits 130; SIGTERM's default would exit at once, leaving
them to finish on their own."""

from __future__ import annotations

import signal
import sys
import threading
from contextlib import contextmanager
from typing import Any, Dict, Iterator

__all__ = ["OWN_PROCESS_GROUP", "Terminated", "sigterm_interrupts"]

# Popen's keywords for a child in a process group of its own (os.killpg then ends it and what it forked: ssh and
# its ProxyCommand, a kubectl wrapper's child; the terminal's Ctrl-C reaches this process alone), in this
# process's session. Not a session of its own (start_new_session): with the kernel's scheduler autogroups (on by
# default) each session competes as one for the CPU, so 64 ssh clients in 64 sessions had 64 shares against one
# for everything else on the machine — this run's own work and, on a loopback sweep, sshd and every probe: a
# 128-host sweep 64 at a time took 44 s instead of 28, and its sessions 545 ms of the host's CPU each instead
# of 311 (2026-12-03). Python 3.11 has process_group; before it, only a session of its own is free of
# preexec_fn, which is unsafe in a program with threads.
OWN_PROCESS_GROUP: Dict[str, Any] = {"process_group": 0} if sys.version_info >= (3, 11) else {"start_new_session": True}


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
