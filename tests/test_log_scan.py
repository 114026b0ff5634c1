"""The log reader's byte-level search: which lines it hands the parsers, where its backward search
lands, and that reading less (small windows, a short grace) gives the same startup."""

from __future__ import annotations

import random

from kvforensics.collectors import logfile
from kvforensics.collectors.logfile import read_log
from kvforensics.collectors.plugin import ENGINES
from tests import logbuilder as lb

ARGS = {"model_path": "/m", "mem_fraction_static": 0.85, "tp_size": 2, "page_size": 1, "speculative_algorithm": None}
KEYWORDS = (b"GB", b"took", b"KV cache size: ")


def _line_starts_by_hand(buf: bytes, keywords) -> set:
    starts, at = set(), 0
    for line in buf.split(b"\n"):
        if any(k in line for k in keywords):
            starts.add(at)
        at += len(line) + 1
    return starts


def _random_text(seed: int) -> bytes:
    rng = random.Random(seed)
    words = [b"GB", b"G", b"B", b"took", b"too", b"ok", b"KV cache size: ", b"KV cache", b"x", b" ", b"\n", b"\n\n"]
    return b"".join(rng.choice(words) for _ in range(rng.randrange(0, 400)))


def test_keyword_lines_are_exactly_the_lines_holding_a_keyword():
    for seed in range(300):
        buf = _random_text(seed)
        assert logfile._keyword_lines(buf, KEYWORDS) == _line_starts_by_hand(buf, KEYWORDS), seed


def test_keyword_lines_at_the_edges():
    assert logfile._keyword_lines(b"GB", KEYWORDS) == {0}  # the first line, without a newline
    assert logfile._keyword_lines(b"a\nGB GB took\n\nGB", KEYWORDS) == {2, 14}
    assert logfile._keyword_lines(b"\n\n", KEYWORDS) == set()


def test_backward_search_finds_the_last_needle_across_blocks(tmp_path, monkeypatch):
    # Small blocks and a small near read, so needles straddle both edges.
    monkeypatch.setattr(logfile, "BLOCK_BYTES", 64)
    monkeypatch.setattr(logfile, "NEAR_BYTES", 48)
    needles = (b"Model loading took", b"# GPU blocks: ", b"KV")
    rng = random.Random(7)
    for _ in range(200):
        parts = [rng.choice(needles + (b"x" * rng.randrange(1, 90), b"\n")) for _ in range(rng.randrange(0, 12))]
        data = b"".join(parts)
        path = tmp_path / "log"
        path.write_bytes(data)
        with open(path, "rb") as f:
            src = logfile._Blocks(f, len(data))
            assert src.rfind(needles) == max((data.rfind(n) for n in needles), default=-1), data
            for end in range(0, len(data) + 1, 7):
                assert src.line_start(end) == (data.rfind(b"\n", 0, end) + 1 if end else 0), (data, end)


def test_a_startup_at_the_top_reads_as_the_startup_alone(tmp_path, monkeypatch):
    monkeypatch.setattr(logfile, "WHOLE_FILE_BYTES", 64 << 10)
    startup = lb.startup(args=ARGS, tokens=4242)
    alone = tmp_path / "alone.log"
    lb.write(alone, startup)
    big = tmp_path / "big.log"
    lb.write(big, startup, lb.noise(40000))  # several MiB of serving lines after it
    assert big.stat().st_size > 4 * logfile.AFTER_ANCHOR_BLOCK_BYTES
    ex, ref = read_log(str(big)), read_log(str(alone))
    assert [(e.kind, e.offset, e.data) for e in ex.startup.events] == [
        (e.kind, e.offset, e.data) for e in ref.startup.events]
    assert ex.count == 1 and ex.index == 1


def test_the_anchor_the_engine_sniff_found_is_not_searched_again(tmp_path, monkeypatch):
    # Head and tail are serving lines only: the sniff finds the last anchor of any engine, and the
    # window is placed from it; a launch after the last load line still needs the load line's own search.
    monkeypatch.setattr(logfile, "WHOLE_FILE_BYTES", 64 << 10)
    monkeypatch.setattr(logfile, "SNIFF_BYTES", 16 << 10)
    log = tmp_path / "served.log"
    lb.write(log, lb.noise(2000), lb.startup(args=ARGS, tokens=3131), lb.noise(2000))
    searches = []
    real = logfile._Blocks.rfind
    monkeypatch.setattr(logfile._Blocks, "rfind", lambda self, needle, end=None, start=0: searches.append(needle) or
                        real(self, needle, end, start))
    auto = read_log(str(log))
    launch = ENGINES.get("sglang").launch_lines  # looked for in the window before the anchor: not an anchor search
    assert len([n for n in searches if n not in (b"\n", launch)]) == 1  # the sniff's, over every engine's anchors
    named = read_log(str(log), engine="sglang")
    assert auto.engine == "sglang" and auto.window_start == named.window_start
    assert [(e.kind, e.offset) for e in auto.startup.events] == [(e.kind, e.offset) for e in named.startup.events]
    relaunch = tmp_path / "relaunch.log"
    lb.write(relaunch, lb.noise(2000), lb.startup(args=ARGS, tokens=3131), lb.noise(500),
             lb.startup(args=ARGS, tokens=1)[:1], lb.noise(2000))
    searches.clear()
    ex, named = read_log(str(relaunch)), read_log(str(relaunch), engine="sglang")
    assert b"Load weight begin. avail mem=" in searches  # searched again: server_args= was the last anchor
    assert [e.kind for e in ex.startup.events] == [e.kind for e in named.startup.events] == ["server_args"]
    assert ex.window_start == named.window_start


def test_a_startup_near_the_end_is_read_from_its_launch_line(tmp_path, monkeypatch):
    """Its server_args= line lies in the first window: the reading starts there (window_start), not a whole
    window before it, and the startup is the one the full window gives. (One line of glued records keeps the
    window's own rules: tests/test_log_memory.py.)"""
    monkeypatch.setattr(logfile, "WHOLE_FILE_BYTES", 64 << 10)
    monkeypatch.setattr(logfile, "FIRST_WINDOW_BYTES", 256 << 10)
    log = tmp_path / "served.log"
    lb.write(log, lb.startup(args=ARGS, tokens=1111), lb.noise(20000), lb.startup(args=ARGS, tokens=2222),
             lb.noise(300))
    ex = read_log(str(log))
    launch = log.read_bytes().rfind(b"server_args=")
    assert ex.window_start == log.read_bytes().rfind(b"\n", 0, launch) + 1
    assert ex.startup.events[0].kind == "server_args" and ex.count is None
    monkeypatch.setattr(logfile, "_from_launch", lambda *a: None)  # the window read as before
    full = read_log(str(log))
    assert full.window_start < ex.window_start
    assert [(e.kind, e.offset, e.data) for e in ex.startup.events] == [
        (e.kind, e.offset, e.data) for e in full.startup.events]


def test_a_bounded_backward_search_stays_within_its_bounds(tmp_path):
    """_Blocks.rfind finds the last needle that begins in [start, end): in its near reads, and in the one read
    of the rest of a bounded range (no search past ``start``); a short needle never begins at ``end`` because
    a longer one makes each read reach past it."""
    far = 24 * logfile.NEAR_BYTES  # past the near reads (1 + 4 + 16 of them)
    data = b"." * 10 + b"AB" + b"-" * far + b"AB" + b"=" * 100
    first, second = 10, 12 + far
    path = tmp_path / "bounded.log"
    path.write_bytes(data)
    with open(path, "rb") as f:
        src = logfile._Blocks(f, len(data))
        assert src.rfind(b"AB") == second
        assert src.rfind(b"AB", second) == first  # the far part, unbounded: collectors/backsearch.py
        assert src.rfind(b"AB", second, first) == first  # the far part, bounded: one read
        assert src.rfind(b"AB", second, first + 1) == -1
        assert src.rfind((b"AB", b"LONG-NEEDLE"), second) == first
        assert src.rfind((b"AB", b"LONG-NEEDLE"), second + 1) == second
        assert src.rfind(b"AB", first, first) == -1
