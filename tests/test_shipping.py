"""What a log's shipper adds to each line is removed, and nothing an engine wrote is (collectors/shipping.py)."""

from __future__ import annotations

import gzip
import json
import os
import re
import tracemalloc

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvforensics.collectors import engine_logs, logfile, shipping
from kvforensics.collectors.logfile import read_log
from kvforensics.collectors.plugin import ENGINES
from kvforensics.collectors.shipping import CriJoiner, Joined, looks_cri, unwrap
from tests import logbuilder as lb
from tests import shippers
from tests.conftest import ROOT, SEED_LOG, run_cli

VLLM_LOG = ROOT / "examples" / "vllm-v0-complete.log"
VLLM_V1_LOG = ROOT / "examples" / "vllm-v1-to-capture.log"

SGLANG_LINES = (
    "[2026-05-01 10:00:00 TP0] Load weight begin. avail mem=78.00 GB",
    "[2026-05-01 10:00:00.123 DP1 PP0 TP3 EP3] KV Cache is allocated. #tokens: 100, K size: 0.01 GB",
    "[2026-05-01T10:00:00 TP0] Load weight end. avail mem=48.00 GB",
    "[12:34:56 TP0] Load weight begin. avail mem=78.00 GB",
    "[2026-05-01 10:00:00] server_args=ServerArgs(model_path='/m')",
    "[gpu_id=0] Load weight begin. avail mem=78.00 GB",
)
VLLM_LINES = (
    "INFO 05-01 10:00:00 [gpu_worker.py:348] Available KV cache memory: 33.31 GiB",
    "(EngineCore_DP0 pid=1) INFO 05-01 10:00:00 [gpu_worker.py:348] Available KV cache memory: 33.31 GiB",
    "(RayWorkerWrapper pid=1861983, ip=10.0.0.2) INFO 03-27 10:29:03 [model_runner.py:1442] Capturing cudagraphs",
    "WARNING 05-01 10:00:00 worker.py:241] Memory profiling takes 19.77 seconds",
)
OTHER_LINES = (
    "2026-05-01 10:00:00,123 - INFO - an application's own logging timestamp (no T, no zone)",
    "2026-05-01T10:00:00 no zone: not a shipper's RFC 3339 stamp",
    ">>> a Python prompt",
    "->  an arrow",
    "  indented text",
    "",
)
ENGINE_LINES = SGLANG_LINES + VLLM_LINES + OTHER_LINES


@pytest.mark.parametrize("line", ENGINE_LINES)
def test_an_engines_own_line_is_left_as_it_is(line):
    assert unwrap(line) == line


@pytest.mark.parametrize("line", ENGINE_LINES)
@pytest.mark.parametrize("prefix", [
    "2026-05-01T10:00:00.123456789Z ",  # kubectl logs --timestamps, docker logs --timestamps
    "2026-05-01T10:00:00Z ",
    "2026-05-01T10:00:00.123456+00:00 ",  # RFC 3339 with an offset
    "2026-05-01T12:00:00.1234567-07:00 ",
    "2026-05-01T10:00:00.123456789Z stdout F ",  # containerd / CRI-O
    "2026-05-01T10:00:00.123456789+00:00 stderr F ",
    "2026-05-01T10:00:00.123456789Z stdout P ",
    "> ",
    ">> ",
    "> > ",
    ">> 2026-05-01T10:00:00.123456789Z ",  # a kubectl line pasted into an issue
    "2026-05-01T10:00:00.123456789Z stdout F > ",
])
def test_a_shippers_prefix_is_removed(prefix, line):
    assert unwrap(prefix + line) == line


def test_ansi_colour_is_removed_anywhere():
    coloured = "\x1b[1;36m(EngineCore_DP0 pid=123)\x1b[0;0m \x1b[32mINFO\x1b[0m 05-01 10:00:00 [gpu_worker.py:348] x"
    assert unwrap(coloured) == "(EngineCore_DP0 pid=123) INFO 05-01 10:00:00 [gpu_worker.py:348] x"
    assert unwrap("\x1b[2m2026-05-01T10:00:00Z\x1b[0m >> [12:34:56 TP0] y") == "[12:34:56 TP0] y"
    assert unwrap("\x1b[\x1b[0m1;36mINFO") == "INFO"  # one escape split by another


def test_only_one_space_of_the_line_itself_goes():
    assert unwrap("2026-05-01T10:00:00Z stdout F    Traceback frame") == "   Traceback frame"
    assert unwrap("2026-05-01T10:00:00Z stdout F") == ""
    assert unwrap(">") == ""


@given(st.text(alphabet=st.sampled_from(list("2026-05-01T:.Z+ >\x1b[1;36m(pid=)INFO stdoutPF")), max_size=60))
def test_unwrapping_twice_changes_nothing(text):
    """A line saved after unwrapping (a bundle) gives the same line when read again."""
    assert unwrap(unwrap(text)) == unwrap(text)


# --- CRI files ---------------------------------------------------------------------------


def test_a_cri_file_is_known_by_its_first_lines():
    cri = (b"2026-05-01T10:00:00.1Z stdout F INFO starting\n"
           b"2026-05-01T10:00:00.2+00:00 stderr P first half \n"
           b"2026-05-01T10:00:00.3Z stderr F second half\n"
           b"2026-05-01T10:00:00.4Z stdout F\n")
    assert looks_cri(cri)
    assert looks_cri(cri + b"2026-05-01T10:00:00.5Z std")  # the head may end inside a record
    assert not looks_cri(b"2026-05-01T10:00:00.1Z INFO starting\n")  # kubectl --timestamps: no stream
    assert not looks_cri(b"[2026-05-01 10:00:00 TP0] Load weight begin.\n")
    assert not looks_cri(cri.replace(b"stderr F second half", b"second half"))  # not every line
    assert not looks_cri(b"")


def _records(*rows):
    """(stream, tag, content) → numbered records as the joiner is fed them."""
    out, offset = [], 0
    for n, (stream, tag, content) in enumerate(rows, 1):
        rec = "2026-05-01T10:00:{:02d}.000000001Z {} {} {}".format(n, stream, tag, content).encode()
        out.append((rec, n, offset))
        offset += len(rec) + 1
    return out


def _feed(joiner, records):
    return [j for j in (joiner.feed(*r) for r in records) if j is not None]


def test_partial_records_are_joined_up_to_the_full_one():
    records = _records(("stdout", "F", "one"), ("stdout", "P", "two "), ("stdout", "P", "and "),
                       ("stdout", "F", "more"), ("stdout", "F", ""))
    j = CriJoiner()
    got = _feed(j, records)
    assert [x.text for x in got] == [b"one", b"two and more", b""]
    assert (got[1].line, got[1].offset) == (2, records[1][2])  # cited at its first record
    assert j.joined == 1 and j.cut == 0 and not j.pending and j.finish() == []


def test_stdout_and_stderr_are_joined_apart():
    """The runtime interleaves the streams' records; each stream's line is joined from its own."""
    records = _records(("stdout", "P", "[2026-05-01 10:00:00 TP0] KV Cache is "), ("stderr", "F", "a warning"),
                       ("stderr", "P", "progress "), ("stdout", "F", "allocated."), ("stderr", "F", "100%"))
    got = _feed(CriJoiner(), records)
    assert [(x.line, x.text) for x in got] == [
        (2, b"a warning"), (1, b"[2026-05-01 10:00:00 TP0] KV Cache is allocated."), (3, b"progress 100%")]


def test_a_partial_run_without_its_full_record_is_kept_at_the_end():
    records = _records(("stdout", "F", "done"), ("stderr", "P", "err "), ("stdout", "P", "cut "),
                       ("stdout", "P", "short"), ("stderr", "P", "tail"))
    j = CriJoiner()
    assert [x.text for x in _feed(j, records)] == [b"done"]
    assert j.pending
    assert j.finish() == [Joined(2, records[1][2], b"err tail"), Joined(3, records[2][2], b"cut short")]
    assert not j.pending


def test_a_line_over_the_cap_is_cut_and_counted():
    records = _records(("stdout", "P", "a" * 6), ("stdout", "P", "b" * 6), ("stdout", "F", "c" * 6),
                       ("stderr", "F", "d" * 20), ("stdout", "F", "short"))
    j = CriJoiner(cap=10)
    assert [x.text for x in _feed(j, records)] == [b"aaaaaabbbb", b"d" * 10, b"short"]
    assert j.cut == 2


def test_a_record_that_is_not_cri_shaped_is_a_line_of_its_own():
    j = CriJoiner()
    assert j.feed(b"plain text", 7, 70) == Joined(7, 70, b"plain text")
    assert j.feed(b"2026-05-01T10:00:00Z stdout F:x tagged", 8, 81) == Joined(8, 81, b"tagged")
    assert j.feed(b"2026-05-01T10:00:01Z stdout P:x more ", 9, 120) is None  # tags after ":" are kept apart
    assert j.feed(b"2026-05-01T10:00:02Z stdout F tags", 10, 160) == Joined(9, 120, b"more tags")


# --- reading through them ------------------------------------------------------------------

def _facts(startup):
    """What an event says, wherever it was read from (the offset moves with the prefix)."""
    return [(e.kind, e.line, e.rank, e.ts, e.data, e.text, e.fmt) for e in startup.events]


def _kubectl(text: str) -> str:
    lines = text.split("\n")  # not splitlines(): a tqdm "\r" is inside the engine's line
    return "".join("2026-05-01T10:00:{:02d}.123456789Z {}\n".format(i % 60, line)
                   for i, line in enumerate(lines[:-1] if text.endswith("\n") else lines))


@pytest.mark.parametrize("log", [VLLM_LOG, SEED_LOG], ids=["vllm", "sglang"])
def test_a_prefixed_log_reads_as_the_plain_one(tmp_path, log):
    plain = read_log(str(log)).startup
    path = tmp_path / "kubectl.log"
    path.write_bytes(_kubectl(log.read_bytes().decode()).encode())
    got = read_log(str(path)).startup
    assert got.engine == plain.engine and _facts(got) == _facts(plain)
    assert [e.raw for e in got.events] == [e.raw for e in plain.events]  # the line the engine wrote


@pytest.mark.parametrize("log", [VLLM_LOG, SEED_LOG], ids=["vllm", "sglang"])
def test_saved_lines_parse_again_to_the_same_events(tmp_path, log):
    """A bundle's lines, and a journal's or docker's still prefixed, go through events.segment."""
    path = tmp_path / "kubectl.log"
    path.write_bytes(_kubectl(log.read_bytes().decode()).encode())
    first = read_log(str(path)).startup
    plugin = ENGINES.get(first.engine)
    (again,) = plugin.segment_lines([(e.line, e.offset, e.raw) for e in first.events])
    assert _facts(again) == _facts(first)
    prefixed = [(n, 0, line) for n, line in enumerate(path.read_bytes().decode().split("\n"), 1)]
    assert _facts(plugin.segment_lines(prefixed)[-1]) == _facts(first)


# --- CRI files, read -----------------------------------------------------------------------


def _cri_file(tmp_path, log, name="0.log", split=512):
    data, first = shippers.cri_with_map(log.read_bytes(), split)
    path = tmp_path / name
    path.write_bytes(data)
    return path, data, first


@pytest.mark.parametrize("log", [VLLM_LOG, SEED_LOG], ids=["vllm", "sglang"])
def test_a_cri_file_reads_as_the_plain_log(tmp_path, log):
    """Same events; each cited at its line's first record, so an editor's line N is the report's."""
    plain = read_log(str(log))
    path, data, first = _cri_file(tmp_path, log, split=64)
    got = read_log(str(path))
    assert got.startup.engine == plain.startup.engine
    assert [first[e.line] for e in got.startup.events] == [e.line for e in plain.startup.events]
    renumbered = [(e.kind, e.rank, e.ts, e.data, e.text, e.fmt) for e in got.startup.events]
    assert renumbered == [(e.kind, e.rank, e.ts, e.data, e.text, e.fmt) for e in plain.startup.events]
    assert [e.raw for e in got.startup.events] == [e.raw for e in plain.startup.events]
    records = data.split(b"\n")
    assert all(records[e.line - 1].startswith(data[e.offset:e.offset + 40]) for e in got.startup.events)
    assert any("(CRI) log" in n and "joined" in n for n in got.notes)
    assert (got.index, got.count) == (plain.index, plain.count)


def test_a_cri_file_compressed_or_piped_is_joined_too(tmp_path):
    plain = read_log(str(SEED_LOG))
    path, data, first = _cri_file(tmp_path, SEED_LOG)
    gz = tmp_path / "0.log.20260501-100000.gz"  # how the kubelet keeps a rotated log
    gz.write_bytes(gzip.compress(data))
    excerpt = read_log(str(gz))
    assert [first[e.line] for e in excerpt.startup.events] == [e.line for e in plain.startup.events]
    code, out, err = run_cli(["analyze", "-", "--json"], stdin=data)
    assert code in (0, 1), err

    def figures(doc):  # where each was read is checked above
        return re.sub(r"line \d+", "line N", json.dumps(doc["targets"][0]["startup"]["ranks"]))

    assert figures(json.loads(out)) == figures(json.loads(run_cli(["analyze", str(SEED_LOG), "--json"])[1]))


def test_a_cri_line_whose_full_record_never_came_is_still_read(tmp_path):
    """The file ends inside a split line (the runtime stopped before its newline, or the file was
    copied while written): what was written of it is parsed."""
    log = tmp_path / "plain.log"  # the excerpt up to its last figure line
    log.write_bytes(b"".join(x + b"\n" for x in shippers.lines_of(VLLM_V1_LOG.read_bytes())[:9]))
    last = shippers.lines_of(log.read_bytes())[-1]
    assert len(last) > 64 and b"Maximum concurrency" in last
    path, data, _ = _cri_file(tmp_path, log, split=32)
    head, final = data.rstrip(b"\n").rsplit(b"\n", 1)
    assert b" stdout F " in final or b" stderr F " in final
    path.write_bytes(head + b"\n" + final.replace(b" F ", b" P ", 1) + b"\n")
    got = read_log(str(path)).startup.events
    plain = read_log(str(log)).startup.events
    assert got[-1].kind == plain[-1].kind and got[-1].data == plain[-1].data
    assert got[-1].raw == last.decode()


def test_a_line_over_the_cap_is_cut_and_said(tmp_path, monkeypatch):
    monkeypatch.setattr(shipping, "MAX_LINE_BYTES", 200)
    path, _, _ = _cri_file(tmp_path, SEED_LOG, split=64)
    excerpt = read_log(str(path))
    assert any("longer than" in n and "were cut" in n for n in excerpt.notes), excerpt.notes
    assert any(e.kind == "summary" for e in excerpt.startup.events)  # short lines are whole


def test_cri_lines_saved_in_a_bundle_parse_again_to_the_same_events(tmp_path):
    path, _, _ = _cri_file(tmp_path, SEED_LOG, split=64)
    section = engine_logs.collect(("file", str(path)))
    assert section["status"] == "ok"
    first = read_log(str(path)).startup
    (again,) = ENGINES.get(section["engine"]).segment_lines([tuple(row) for row in section["lines"]])
    assert [(e.kind, e.line, e.data) for e in again.events if e.kind != "server_args"] == \
        [(e.kind, e.line, e.data) for e in first.events if e.kind != "server_args"]  # server_args: redacted


def test_memory_stays_flat_under_a_runaway_partial_line(tmp_path, monkeypatch):
    """P records that never end (a process printing without a newline): the joined line stops
    growing at the cap, and the startup after it is still read."""
    monkeypatch.setattr(shipping, "MAX_LINE_BYTES", 1 << 20)
    record = shippers.stamp(1) + b" stdout P " + b"x" * 16000 + b"\n"
    path = tmp_path / "0.log"
    with open(str(path), "wb") as f:
        for _ in range(1300):  # ~20 MiB, one stream
            f.write(record)
        f.write(shippers.cri(SEED_LOG.read_bytes()).replace(b" stdout ", b" stderr "))
    tracemalloc.start()
    try:
        excerpt = read_log(str(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 12 << 20, peak
    assert any(e.kind == "summary" for e in excerpt.startup.events)
    assert any("were cut" in n for n in excerpt.notes)


@pytest.mark.parametrize("noise_records", [0, 2300, 2450, 2600, 2674])  # 98-byte records: 256 KiB inside the log
def test_a_split_line_across_the_readers_blocks_is_joined(tmp_path, noise_records):
    """Whole-record blocks are read as a plain file's, blocks with partial records are joined: a run
    that begins in one block and ends in the next is still one line, wherever the block ends."""
    noise = b"".join(shippers.stamp(n) + b" stdout F INFO:     127.0.0.1:40000 - \"GET /health HTTP/1.1\" 200 OK\n"
                     for n in range(noise_records))
    data, first = shippers.cri_with_map(SEED_LOG.read_bytes(), split=64)
    path = tmp_path / "0.log"
    path.write_bytes(noise + data)
    plain = read_log(str(SEED_LOG)).startup.events
    got = read_log(str(path)).startup.events
    assert [first[e.line - noise_records] for e in got] == [e.line for e in plain]
    assert [(e.kind, e.data) for e in got] == [(e.kind, e.data) for e in plain]


def test_a_full_record_in_a_block_without_partials_still_closes_its_line(tmp_path):
    """The block boundary falls between a line's P record and its F record, and the next block has no
    P record: the F record still ends the line begun in the block before."""
    line = b"[2026-05-01 10:00:00 TP0] KV Cache is allocated. #tokens: 159277, K size: 5.21 GB, V size: 5.21 GB"
    begin = shippers.stamp(0) + b" stdout F [2026-05-01 10:00:00 TP0] Load weight begin. avail mem=78.00 GB\n"
    noise = shippers.stamp(0) + b" stdout F INFO:     127.0.0.1:40000 - \"GET /health HTTP/1.1\" 200 OK\n"
    block = 256 << 10  # the reader's stream block (logfile.STREAM_READ_BYTES)
    before = noise * ((block - len(begin)) // len(noise) - 1)
    run = shippers.stamp(1) + b" stdout P " + line[:40] + b"\n" + shippers.stamp(2) + b" stdout F " + line[40:] + b"\n"
    assert block - len(begin) - len(before) - len(noise) < len(run)
    for pad in range(0, len(noise) + len(run), 9):  # the boundary at every few bytes of the run
        path = tmp_path / "0.log"
        padded = shippers.stamp(0) + b" stdout F " + b"x" * pad + b"\n"
        path.write_bytes(begin + padded + before + run + noise * 10)
        events = read_log(str(path), engine="sglang").startup.events
        assert [e.kind for e in events] == ["load_begin", "kv_pool"], pad
        assert events[1].raw == line.decode() and events[1].data["tokens"] == 159277
        assert events[1].line == 3 + len(before) // len(noise)


@pytest.mark.parametrize("kind", ["docker", "journal"])
def test_docker_and_journal_lines_with_a_prefix_are_read(tmp_path, monkeypatch, kind):
    """``docker logs`` of a container whose process was itself piped through a timestamping shipper,
    a journal of a unit that runs ``kubectl logs -f --timestamps``: the lines go through events.segment."""
    wrapped = tmp_path / "wrapped.log"
    wrapped.write_bytes(shippers.stacked(VLLM_V1_LOG.read_bytes()))
    script = "cat {}\n".format(wrapped) if kind == "docker" else "tac {}\n".format(wrapped)
    for name, body in ((kind if kind == "docker" else "journalctl", script), ("systemctl", "echo\n")):
        tool = tmp_path / name
        tool.write_text("#!/bin/sh\n" + body)
        tool.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path) + os.pathsep + os.environ["PATH"])
    section = engine_logs.collect((kind, "vllm-0"), engine="vllm")
    assert section["status"] == "ok", section["problems"]
    plain = read_log(str(VLLM_V1_LOG)).startup.events
    assert [raw for _, _, raw in section["lines"]] == [e.raw for e in plain]


@pytest.mark.parametrize("wrapping", ["kubectl", "stacked"])
def test_a_large_prefixed_file_is_still_read_from_the_end(tmp_path, monkeypatch, wrapping):
    """The backward reading of plain files is unchanged: its anchors and keywords are inside the
    engine's message, which no shipper touches."""
    monkeypatch.setattr(logfile, "WHOLE_FILE_BYTES", 64 << 10)
    monkeypatch.setattr(logfile, "FIRST_WINDOW_BYTES", 16 << 10)
    monkeypatch.setattr(logfile, "BLOCK_BYTES", 32 << 10)
    args = {"model_path": "/m", "mem_fraction_static": 0.85, "tp_size": 2, "page_size": 1}
    plain = tmp_path / "plain.log"
    lb.write(plain, lb.startup(args=args, tokens=1111), lb.noise(20000), lb.startup(args=args, tokens=2222))
    path = tmp_path / "wrapped.log"
    path.write_bytes(shippers.WRAPPINGS[wrapping](plain.read_bytes()))
    want, got = read_log(str(plain)), read_log(str(path))
    assert got.window_start > path.stat().st_size // 2 and got.count is None
    assert _facts(got.startup) == _facts(want.startup)
    assert next(e for e in got.startup.events if e.kind == "kv_pool").data["tokens"] == 2222
