"""A run that reaches other machines, told to stop: Ctrl-C, or SIGTERM (``timeout``, systemd, a pod's grace
period). Both end it the same way, as KeyboardInterrupt in the main thread, so that what it started (ssh, kubectl)
is ended and its temporary folders removed before it exits 130; SIGTERM's default would exit at once, leaving
them to finish on their own."""

from __future__ import annotations

import os
import signal
import sys
import threading
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Dict, Iterator

if TYPE_CHECKING:
    import subprocess

__all__ = ["OWN_PROCESS_GROUP", "Terminated", "kill_group", "sigterm_interrupts"]

# Popen's keywords for a child in a process group of its own: os.killpg then ends it and what it forked (ssh and its
# ProxyCommand, a kubectl wrapper's child), and the terminal's Ctrl-C reaches this process alone. A group in this
# process's session (Python 3.11+), not a session of its own: with the kernel's scheduler autogroups (on by default)
# each session competes as one for the CPU, so 64 ssh clients in 64 sessions took 64 shares against one for all else
# on the machine. Measured (2026-12-03, bench/RESULTS.md): 128 loopback hosts 64 at a time, 33 s instead of 53 s.
OWN_PROCESS_GROUP: Dict[str, Any] = {"process_group": 0} if sys.version_info >= (3, 11) else {"start_new_session": True}


def kill_group(proc: "subprocess.Popen[bytes]", signum: int = signal.SIGKILL) -> None:
    """``signum`` to a child and everything in its group when it leads one (started with OWN_PROCESS_GROUP), to
    the child alone when it shares ours (an ssh in the terminal's foreground, asking for a passphrase); gone
    already is fine."""
    try:
        if os.getpgid(proc.pid) == proc.pid:
            os.killpg(proc.pid, signum)
        else:
            proc.send_signal(signum)  # which reaps first, so never a pid the kernel has given to another
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
