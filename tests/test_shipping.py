"""What a log's shipper adds to each line is removed, and nothing an engine wrote is (collectors/shipping.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from collectors.logfile import read_log
from collectors.plugin import ENGINES
from collectors.shipping import CriJoiner, Joined, looks_cri, unwrap
from tests.conftest import ROOT, SEED_LOG

VLLM_LOG = ROOT / "examples" / "vllm-v0-complete.log"

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
