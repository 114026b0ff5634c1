"""The far part of a backward needle search in a big file: where is the last of these needles before ``end``?

``bytes.rfind`` holds the GIL and the standard library has no multi-needle search, so a file whose last
needle lies near its top costs one pass per needle over all of it (vLLM's nine anchors: ~0.75 s per GiB
here). Two things keep that to what the machine allows:

* a reader thread fills the next block (``os.preadv`` releases the GIL) while this thread searches the
  current one: on two cores a 2 GiB scan dropped from 0.25 s to 0.16 s;
* with a second CPU free, a child process (``os.fork``: no interpreter to start, the open file shared)
  searches the lower half while this process searches the upper one. The upper half's answer wins
  whenever it has one (any of its offsets is above all of the lower half's), so the child is then
  killed unfinished; otherwise its answer is read from a pipe. The answer is the sequential search's,
  byte for byte: each half reads ``overlap`` bytes past its end, so a needle across the cut is found
  by the half it starts in. The child stops by itself if this process dies (its parent changes), so
  nothing is left running on an inspected host.

Everything here reads with ``os.pread``/``preadv`` at explicit offsets: the processes share the file
descriptor, and nothing moves its offset.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Optional, Sequence, Tuple

# Below this, a second process costs more than it saves (a fork, and the page-table copy it makes).
SPLIT_MIN_BYTES = 64 << 20


def last(fd: int, needles: Sequence[bytes], end: int, size: int, block: int) -> int:
    """Offset of the last of ``needles`` that starts before ``end``, or -1, reading ``block`` bytes at a time
    (see the module's doc). ``size``: the file's, so a read past ``end`` stays inside it."""
    span = _Span(fd, tuple(needles), max(len(n) for n in needles) - 1, size, block)
    cut = end // 2
    half = _Half.start(span, cut) if _can_split(end) else None
    if half is None:
        return _threaded(span, end, 0)
    try:
        found = _threaded(span, end, cut)
        if found != -1:
            return found
        lower = half.answer()
        return lower if lower is not None else _threaded(span, cut, 0)
    finally:
        half.stop()


class _Span:
    """What every part of one search shares: the file, the needles, how far a read goes past its end (a
    needle across a block's end is found in the block it starts in), the file's size and the block size."""

    def __init__(self, fd: int, needles: Tuple[bytes, ...], overlap: int, size: int, block: int) -> None:
        self.fd, self.needles, self.overlap, self.size, self.block = fd, needles, overlap, size, block

    def read_into(self, buf: bytearray, start: int, at: int) -> int:
        """[start, at) and the overlap after it into ``buf``; how many bytes came."""
        return os.preadv(self.fd, [memoryview(buf)[:min(at - start + self.overlap, self.size - start)]], start)

    def last_in(self, buf: bytearray, start: int, got: int) -> int:
        hits = [start + h for h in (buf.rfind(n, 0, got) for n in self.needles) if h != -1]
        return max(hits) if hits else -1


def _can_split(end: int) -> bool:
    """A big span, a second CPU this process may run on, and no other thread (forking a process whose
    other threads may hold locks is how a child deadlocks)."""
    if end < SPLIT_MIN_BYTES or not hasattr(os, "fork") or not hasattr(os, "sched_getaffinity"):
        return False
    try:
        cpus = len(os.sched_getaffinity(0))
    except OSError:
        return False
    threading = sys.modules.get("threading")  # not imported: no thread but this one (probes rarely import it)
    return cpus >= 2 and (threading is None or threading.active_count() == 1)


def _threaded(span: _Span, end: int, low: int) -> int:
    """The last needle starting in [low, end), blocks read by a second thread while this one searches."""
    import queue
    import threading

    buffers = [bytearray(span.block + span.overlap) for _ in range(3)]  # the reader never fills the one searched
    ready: "queue.Queue[Optional[Tuple[int, int, int]]]" = queue.Queue(maxsize=1)
    stop = threading.Event()

    def reader() -> None:
        at, slot = end, 0
        try:
            while at > low and not stop.is_set():
                start = max(low, at - span.block)
                ready.put((start, slot, span.read_into(buffers[slot], start, at)))
                slot, at = (slot + 1) % 3, start
        finally:
            ready.put(None)

    thread = threading.Thread(target=reader, name="kvf-log-reader", daemon=True)
    thread.start()
    try:
        while True:
            item = ready.get()
            if item is None:
                return -1
            start, slot, got = item
            found = span.last_in(buffers[slot], start, got)
            if found != -1:
                return found
    finally:
        stop.set()
        while thread.is_alive():  # unblock a reader waiting to put, then let it finish
            try:
                ready.get_nowait()
            except queue.Empty:
                thread.join(0.01)


class _Half:
    """A child process searching [0, end) backward; its answer comes back through a pipe."""

    def __init__(self, pid: int, pipe: int) -> None:
        self.pid: Optional[int] = pid
        self.pipe: Optional[int] = pipe

    @classmethod
    def start(cls, span: _Span, end: int) -> "Optional[_Half]":
        """The child, started; None when no process could be made (then search [0, end) here)."""
        try:
            read_end, write_end = os.pipe()
        except OSError:
            return None
        parent = os.getpid()
        try:
            pid = os.fork()
        except OSError:
            os.close(read_end)
            os.close(write_end)
            return None
        if pid == 0:  # the child: never returns into the parent's code, never flushes the parent's buffers
            code = 1
            try:
                os.close(read_end)
                os.write(write_end, str(_plain(span, end, parent)).encode("ascii"))
                code = 0
            finally:
                os._exit(code)
        os.close(write_end)
        return cls(pid, read_end)

    def answer(self) -> Optional[int]:
        """The child's offset (or -1); None if it failed (then search its half here)."""
        data = b""
        while self.pipe is not None:
            chunk = os.read(self.pipe, 64)
            if not chunk:
                break
            data += chunk
        status = self._reap()
        if status is None or not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
            return None
        try:
            return int(data)
        except ValueError:
            return None

    def stop(self) -> None:
        """Kill the child if it still runs, reap it, close the pipe: called whatever happened."""
        if self.pid is not None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._reap()
        if self.pipe is not None:
            os.close(self.pipe)
            self.pipe = None

    def _reap(self) -> Optional[int]:
        if self.pid is None:
            return None
        try:
            _, status = os.waitpid(self.pid, 0)
        except ChildProcessError:
            status = None
        self.pid = None
        return status


def _plain(span: _Span, end: int, parent: int) -> int:
    """The child's search: one buffer, no thread; it gives up when its parent is gone."""
    buf = bytearray(span.block + span.overlap)
    at = end
    while at > 0:
        if os.getppid() != parent:
            return -1
        start = max(0, at - span.block)
        found = span.last_in(buf, start, span.read_into(buf, start, at))
        if found != -1:
            return found
        at = start
    return -1
