"""The far part of a backward needle search in a big file: where is the last of these needles before ``end``?

``bytes.rfind`` holds the GIL and the standard library has no multi-needle search, so a file whose last
needle lies near its top costs one pass per needle over all of it (vLLM's nine anchors: ~0.75 s per GiB
here). Two things keep that to what the machine allows:

* a reader thread fills the next block (``os.preadv`` releases the GIL) while this thread searches the
  current one: on two cores a 2 GiB scan dropped from 0.25 s to 0.16 s;
* with more CPUs free, the span is cut into parts (one per CPU, at most four, none under 32 MiB): this
  process searches the top one and a child process each of the others (``os.fork``: no interpreter to
  start, the open file shared). The highest part with a needle holds the answer (any of its offsets is
  above all of a lower part's), so the answers are taken from the top down and the children below the
  first hit are killed unfinished; each answer comes through a pipe. The result is the sequential
  search's, byte for byte: each part reads ``overlap`` bytes past its end, so a needle across a cut is
  found by the part it starts in. A child stops by itself if this process dies (its parent changes), so
  nothing is left running on an inspected host.

Everything here reads with ``os.pread``/``preadv`` at explicit offsets: the processes share the file
descriptor, and nothing moves its offset.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Optional, Sequence, Tuple

# A part below this costs more in a process of its own than it saves (a fork, and the page tables it copies).
PART_MIN_BYTES = 32 << 20
MAX_PARTS = 4  # on a busy inference host a log search takes at most this many CPUs, for a fraction of a second


def last(fd: int, needles: Sequence[bytes], end: int, size: int, block: int) -> int:
    """Offset of the last of ``needles`` that starts before ``end``, or -1, reading ``block`` bytes at a time
    (see the module's doc). ``size``: the file's, so a read past ``end`` stays inside it."""
    span = _Span(fd, tuple(needles), max(len(n) for n in needles) - 1, size, block)
    parts = _parts(end)
    if parts == 1:
        return _threaded(span, end, 0)
    cuts = [end * i // parts for i in range(parts + 1)]  # part i is [cuts[i], cuts[i + 1]); the top one is ours
    children = [_Part.start(span, cuts[i], cuts[i + 1]) for i in range(parts - 1)]
    try:
        found = _threaded(span, end, cuts[-2])
        for i in reversed(range(parts - 1)):  # the highest part with a needle holds the answer
            if found != -1:
                return found
            child = children[i]
            answer = child.answer() if child is not None else None
            found = answer if answer is not None else _threaded(span, cuts[i + 1], cuts[i])
        return found
    finally:
        for child in children:
            if child is not None:
                child.stop()


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


def _parts(end: int) -> int:
    """How many processes search [0, end): one per CPU this process may run on, at most MAX_PARTS, none with
    less than PART_MIN_BYTES; and one alone beside another thread (a child forked while another thread holds
    a lock can deadlock on it)."""
    if end < 2 * PART_MIN_BYTES or not hasattr(os, "fork"):
        return 1
    threading = sys.modules.get("threading")  # not imported: no thread but this one (probes rarely import it)
    if threading is not None and threading.active_count() != 1:
        return 1
    return max(1, min(_cpus(), MAX_PARTS, end // PART_MIN_BYTES))


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return 1


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


class _Part:
    """A child process searching [low, end) backward; its answer comes back through a pipe."""

    def __init__(self, pid: int, pipe: int) -> None:
        self.pid: Optional[int] = pid
        self.pipe: Optional[int] = pipe

    @classmethod
    def start(cls, span: _Span, low: int, end: int) -> "Optional[_Part]":
        """The child, started; None when no process could be made (then its part is searched here)."""
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
                os.write(write_end, str(_plain(span, low, end, parent)).encode("ascii"))
                code = 0
            finally:
                os._exit(code)
        os.close(write_end)
        return cls(pid, read_end)

    def answer(self) -> Optional[int]:
        """The child's offset (or -1); None if it failed (then its part is searched here)."""
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


def _plain(span: _Span, low: int, end: int, parent: int) -> int:
    """The child's search of [low, end): one buffer, no thread; it gives up when its parent is gone."""
    buf = bytearray(span.block + span.overlap)
    at = end
    while at > low:
        if os.getppid() != parent:
            return -1
        start = max(low, at - span.block)
        found = span.last_in(buf, start, span.read_into(buf, start, at))
        if found != -1:
            return found
        at = start
    return -1
