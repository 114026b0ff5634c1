"""Run a function inside another process's network namespace: how a pod's loopback is reached.

An engine in a pod (or a container with its own network) often listens on 127.0.0.1, or on a port
the host does not see: its loopback is its network namespace's, not the host's. Asking the host's
127.0.0.1 would reach nothing, or worse another pod's engine on the same port. So the request is
made from a short-lived thread that first joins the engine's namespace through
``/proc/PID/ns/net`` with setns(2) (libc through ctypes; Python has ``os.setns`` only from 3.12).
A network namespace belongs to a thread, not to the process: the caller's threads stay where they
are, and the thread ends with the request. Nothing here takes a name, a path or a command from the
user: only a PID the /proc scan found.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable, List, Optional

CLONE_NEWNET = 0x40000000  # include/uapi/linux/sched.h
JOIN_TIMEOUT_S = 30.0  # the thread's own requests are bounded; this only guards against a stuck libc call


class NamespaceError(OSError):
    """The namespace cannot be entered (not root, the process is gone, no setns here); one sentence."""


def _link(root: str, pid: Any) -> Optional[str]:
    try:
        return os.readlink(os.path.join(root, "proc", str(pid), "ns", "net"))
    except OSError:
        return None


def namespace_of(root: str, pid: int) -> Optional[str]:
    """``net:[inode]`` of a process, or None when it cannot be read (another user's process, gone)."""
    return _link(root, pid)


def foreign_namespace(root: str, pid: int) -> Optional[str]:
    """The process's network namespace when it is known to differ from this one's, else None (the same,
    or unknowable: then this namespace's loopback is the only one to ask, as before)."""
    theirs, ours = _link(root, pid), _link(root, "self")
    return theirs if theirs is not None and ours is not None and theirs != ours else None


def _setns(fd: int) -> None:
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c") or "libc.so.6"
    libc = ctypes.CDLL(name, use_errno=True)
    if not hasattr(libc, "setns"):
        raise NamespaceError("this C library has no setns()")
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise NamespaceError("setns: {}".format(os.strerror(err)))


def call_in(root: str, pid: int, fn: Callable[[], Any]) -> Any:
    """``fn()`` run in a new thread that has joined ``pid``'s network namespace; its result, or its
    exception re-raised here. NamespaceError when the namespace cannot be entered."""
    path = os.path.join(root, "proc", str(pid), "ns", "net")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise NamespaceError("cannot open {}: {}".format(path, exc.strerror)) from None
    outcome: List[Any] = []

    def run() -> None:
        try:
            _setns(fd)
            outcome.append((True, fn()))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            outcome.append((False, exc))

    try:
        worker = threading.Thread(target=run, name="kvf-netns-{}".format(pid), daemon=True)
        worker.start()
        worker.join(JOIN_TIMEOUT_S)
    finally:
        os.close(fd)
    return _result(outcome)


def _result(outcome: List[Any]) -> Any:
    if not outcome:
        raise NamespaceError("the request in the engine's network namespace did not finish")
    ok, value = outcome[0]
    if not ok:
        raise value
    return value
