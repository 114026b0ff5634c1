"""The far backward search (collectors/backsearch.py): cut into parts searched by this process and children,
it answers exactly what one sequential search does, leaves no process behind, and searches a failed child's
part itself."""

from __future__ import annotations

import os
import random
import threading

import pytest

from kvforensics.collectors import backsearch

NEEDLES = (b"Model loading took", b"# GPU blocks: ", b"KV cache")


def _reference(data: bytes, needles, end: int) -> int:
    """One plain search: the last occurrence that ends by ``end`` + the longest needle - 1 (what a block read
    past its end sees), as the sequential code answers."""
    limit = min(len(data), end + max(len(n) for n in needles) - 1)
    return max(data.rfind(n, 0, limit) for n in needles)


@pytest.fixture(params=[2, 3, 4], ids=lambda k: "{}-parts".format(k))
def split_always(monkeypatch, request):
    """Every search of two bytes or more cut into 2, 3 or 4 parts (as many CPUs, whatever this machine has);
    the children's PIDs, as they start."""
    if not hasattr(os, "fork"):
        pytest.skip("the split needs fork")
    monkeypatch.setattr(backsearch, "PART_MIN_BYTES", 1)
    monkeypatch.setattr(backsearch, "_cpus", lambda: request.param)
    started = []
    real = backsearch._Part.start.__func__

    def start(cls, span, low, end):
        part = real(cls, span, low, end)
        started.append(part.pid if part is not None else None)
        return part

    monkeypatch.setattr(backsearch._Part, "start", classmethod(start))
    return started


def _search(tmp_path, data: bytes, end: int, block: int = 64) -> int:
    path = tmp_path / "log"
    path.write_bytes(data)
    with open(path, "rb") as f:
        return backsearch.last(f.fileno(), NEEDLES, end, len(data), block)


def test_split_search_answers_as_one_search(tmp_path, split_always):
    rng = random.Random(7)
    for trial in range(60):
        size = rng.randrange(200, 4000)
        data = bytearray(rng.choice(b"abc \n") for _ in range(size))
        for _ in range(rng.randrange(0, 4)):  # needles anywhere: across blocks, across the cut, none at all
            n = rng.choice(NEEDLES)
            at = rng.randrange(0, size - len(n))
            data[at:at + len(n)] = n
        end = rng.randrange(1, size + 1)
        assert _search(tmp_path, bytes(data), end) == _reference(bytes(data), NEEDLES, end), trial
    assert any(split_always)  # the child really ran


def test_a_needle_across_a_cut_is_found_once(tmp_path, split_always):
    size = 1200
    for cut in (size * i // 4 for i in (1, 2, 3)):  # the 2, 3 and 4-part cuts, each crossed
        for start in range(cut - len(NEEDLES[0]) + 1, cut + 1):
            data = bytearray(b"x" * size)
            data[start:start + len(NEEDLES[0])] = NEEDLES[0]
            assert _search(tmp_path, bytes(data), size, block=50) == start, (cut, start)
    assert split_always


def test_the_child_is_gone_whichever_half_answers(tmp_path, split_always):
    data = bytearray(b"y" * 4000)
    data[3900:3900 + 8] = b"KV cache"  # the top part: every child is killed unfinished
    assert _search(tmp_path, bytes(data), 4000) == 3900
    data = bytearray(b"y" * 4000)
    data[10:18] = b"KV cache"  # the bottom part: every child's answer is read
    assert _search(tmp_path, bytes(data), 4000) == 10
    assert len(split_always) >= 2 and None not in split_always
    for pid in split_always:
        with pytest.raises(ProcessLookupError):  # reaped, not a zombie
            os.kill(pid, 0)


def test_a_failed_child_leaves_its_half_to_the_parent(tmp_path, split_always, monkeypatch):
    def broken(span, low, end, parent):
        raise RuntimeError("the child fails")

    monkeypatch.setattr(backsearch, "_plain", broken)  # what the forked child runs
    data = bytearray(b"z" * 4000)
    data[100:108] = b"KV cache"
    assert _search(tmp_path, bytes(data), 4000) == 100


def test_how_many_parts(monkeypatch):
    mib = 1 << 20
    monkeypatch.setattr(backsearch, "_cpus", lambda: 16)
    assert backsearch._parts(63 * mib) == 1  # two parts of 32 MiB at least
    assert backsearch._parts(64 * mib) == 2 and backsearch._parts(100 * mib) == 3
    assert backsearch._parts(1 << 30) == backsearch.MAX_PARTS  # at most four CPUs, however many there are
    monkeypatch.setattr(backsearch, "_cpus", lambda: 1)
    assert backsearch._parts(1 << 30) == 1
    monkeypatch.setattr(backsearch, "_cpus", lambda: 16)
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert backsearch._parts(1 << 30) == 1  # no fork beside another thread
    finally:
        stop.set()
        other.join()


def test_the_child_stops_when_its_parent_is_gone(tmp_path):
    path = tmp_path / "log"
    path.write_bytes(b"KV cache" + b"q" * 1000)
    with open(path, "rb") as f:
        span = backsearch._Span(f.fileno(), NEEDLES, 17, 1008, 64)
        assert backsearch._plain(span, 0, 1008, parent=os.getppid()) == 0
        assert backsearch._plain(span, 0, 1008, parent=-1) == -1  # not its parent any more: gives up at once
