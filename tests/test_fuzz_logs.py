"""Hostile logs: every crash a fuzz campaign found, each pinned, and a seeded mutation campaign over
both engines' real logs (tests/fixtures/real_sglang, real_vllm, examples/*.log).

A mutated log may be refused (exit 2, one line) or analysed (exit 0 or 1); never an internal error
(exit 4), and ``--json`` is always strict JSON valid against the report schema (run_cli checks it).
The campaign is seeded, so a failure names the case that reproduces it: ``KVF_FUZZ_SEED=S
KVF_FUZZ_CASES=N`` runs another or a bigger one by hand (the suite runs FUZZ_CASES).
"""

from __future__ import annotations

import json
import os
import random
import re
from pathlib import Path
from typing import Callable, List

import pytest

from kvforensics.agent.sglang import budget
from kvforensics.collectors.vllm.log import parse_line as vllm_parse_line
from kvforensics.collectors.vllm.log import split_record
from tests.conftest import EACH_FORMAT, FIXTURES, ROOT, SEED_LOG, run_cli, run_in_each_format

LOGS = sorted(FIXTURES.glob("real_*/*.log")) + sorted((ROOT / "examples").glob("*.log"))
FORMATS = EACH_FORMAT


def _analyze_everywhere(path: Path, formats=FORMATS) -> List[int]:
    """Exit codes of ``analyze`` in each format; fails on exit 4, a traceback or a second stderr line."""
    return run_in_each_format(["analyze", str(path)], formats, (0, 1, 2))


def _json(path: Path) -> dict:
    code, out, err = run_cli(["analyze", str(path), "--json"])
    assert code in (0, 1), err
    return json.loads(out)["targets"][0]


def _seed_with(tmp_path: Path, old: str, new: str, count: int = 0) -> Path:
    text = SEED_LOG.read_text(encoding="utf-8")
    assert re.search(old, text), old
    path = tmp_path / "seed.log"
    path.write_text(re.sub(old, new, text, count=count), encoding="utf-8")
    return path


# --- the crash sites a campaign found (each was exit 4) ----------------------------------------

def test_a_huge_page_size_is_an_unknown_flag_not_a_division_by_zero(tmp_path):
    # page_size 10^20: bytes per token rounded to 0, then the budget divided by it.
    path = _seed_with(tmp_path, r"page_size=\d+", "page_size=" + "9" * 20)
    assert _analyze_everywhere(path) == [1, 1, 1, 1]
    t = _json(path)
    assert any(p["code"] == "server_args.invalid" and "page_size" in p["message"] for p in t["problems"])
    assert t["startup"]["budget"]["verdict"] == "agrees"  # the page size SGLang uses by default: 1


def test_a_pool_of_more_tokens_than_bytes_gives_no_bytes_per_token(tmp_path):
    # #tokens 10^13 in a 10 GiB pool: under a byte per token; the formula would divide by 0.
    path = _seed_with(tmp_path, r"#tokens: 159277", "#tokens: 10000000000000")
    _analyze_everywhere(path)
    assert _json(path)["startup"]["budget"]["bytes_per_token"] is None


def test_a_forged_max_running_requests_is_unknown_not_an_overflow(tmp_path):
    # A 20-digit --max-running-requests once made the speculative headroom, and then the gap the
    # verdict prints, too large for a float (budget._differs).
    path = _seed_with(tmp_path, r"max_running_requests=64", "max_running_requests=" + "9" * 20)
    _analyze_everywhere(path)
    problems = _json(path)["problems"]
    assert any("max_running_requests" in p["message"] for p in problems if p["code"] == "server_args.invalid")


def test_a_vllm_pool_of_more_tokens_than_bytes_has_no_bytes_per_token(tmp_path):
    from kvforensics.agent.model.analyze import analyze_startup
    from kvforensics.agent.model.records import Options
    from kvforensics.collectors.logfile import read_log

    path = tmp_path / "v1.log"
    text = (ROOT / "examples" / "vllm-v1-to-capture.log").read_text(encoding="utf-8")
    path.write_text(text.replace("1,587,648 tokens", "9,999,999,999,999 tokens"), encoding="utf-8")
    _analyze_everywhere(path)
    a = analyze_startup(read_log(str(path)).startup, "file:x", Options())
    assert a.budget.cell_bytes is None  # 33 GiB over 10^13 tokens is under a byte: unknown, never 0


def test_the_gap_of_a_differing_pool_is_shown_whatever_its_size():
    text = budget._differs(logged=1, lo=10**300, hi=10**300, cell=10**20, ranks=())
    assert "fewer than the formula allows" in text


@pytest.mark.parametrize("digits", [400, 4400])
def test_a_memory_figure_of_hundreds_of_digits_is_an_unrecognised_line(tmp_path, digits):
    path = _seed_with(tmp_path, r"mem usage=1\.06 GB", "mem usage={} GB".format("9" * digits), count=1)
    _analyze_everywhere(path)
    assert any(p["code"] == "log.unrecognized" for p in _json(path)["problems"])


@pytest.mark.parametrize("digits", [400, 4400])
def test_a_context_len_of_hundreds_of_digits_is_an_unrecognised_line(tmp_path, digits):
    path = _seed_with(tmp_path, r"context_len=\d+", "context_len=" + "9" * digits)
    _analyze_everywhere(path)
    t = _json(path)
    assert t["startup"]["context_len"] is None
    assert any(p["code"] == "log.unrecognized" for p in t["problems"])


def test_a_ray_repeat_count_past_the_int_text_limit_is_no_count():
    # int() of a 4,400-digit text raises (Python's 4,300-digit limit).
    line = ("(RayWorkerWrapper pid=1, ip=10.0.0.2) INFO 02-11 10:17:54 worker.py:294] Memory profiling takes "
            "0.44 seconds [repeated {}x across cluster]".format("9" * 4400))
    assert split_record(line)[3:] == ("Memory profiling takes 0.44 seconds", None)
    (ev,) = vllm_parse_line(line)
    assert ev.kind == "profile_begin" and "repeated" not in ev.data


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e999", "-1"])
def test_non_finite_and_negative_flags_are_unknown(tmp_path, value):
    path = _seed_with(tmp_path, r"mem_fraction_static=0\.88", "mem_fraction_static=" + value)
    _analyze_everywhere(path)
    t = _json(path)
    assert t["startup"]["budget"]["mem_fraction_static"] != float(value)  # back-solved or unknown, never it


def _numbers(x):  # type: ignore[no-untyped-def]
    if isinstance(x, bool):
        return
    if isinstance(x, (int, float)):
        yield x
    elif isinstance(x, dict):
        for v in x.values():
            yield from _numbers(v)
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _numbers(v)


@pytest.mark.parametrize("huge", ["9" * 400, "1" + "0" * 30])
def test_every_figure_a_line_format_extracts_is_bounded(huge):
    """Every figure either engine's rows take from any real line with one of its numbers made huge is
    finite and at most 2^60 (a PiB in bytes, 10^13 tokens), or the line is not recognised at all."""
    from kvforensics.collectors.sglang.log import parse_line as sglang_parse_line

    parsers = (sglang_parse_line, vllm_parse_line)
    lines = {line for log in LOGS for line in log.read_text(encoding="utf-8", errors="replace").splitlines()
             if any(parse(line) for parse in parsers)}  # the lines a row recognises, once each
    checked = 0
    for line in sorted(lines):
        for m in _NUMBER.finditer(line.encode("utf-8")):
            raw = line.encode("utf-8")
            hostile = (raw[:m.start()] + huge.encode() + raw[m.end():]).decode("utf-8")
            for parse in parsers:
                for ev in parse(hostile):
                    if ev.kind in ("server_args", "args"):
                        continue  # flags are kept as printed, and typed where the model reads them (flags.py)
                    bad = [x for x in _numbers(ev.data) if not (x == x and abs(x) <= 1 << 60)]
                    assert not bad, (ev.fmt, hostile[:200], bad[:3])
                    checked += 1
    assert checked > 1000


# --- the seeded mutation campaign --------------------------------------------------------------

FUZZ_CASES = int(os.environ.get("KVF_FUZZ_CASES", "1200"))
FUZZ_SEED = int(os.environ.get("KVF_FUZZ_SEED", "20261201"))
CHUNKS = 12
HUGE = [b"9" * 400, b"9" * 4400, b"10000000000000", b"99999999999999999999", b"18446744073709551616",
        b"0", b"0.00", b"-1", b"-0.0", b"1e400", b"1e-400"]
NOT_FINITE = [b"nan", b"NaN", b"inf", b"-inf", b"Infinity", b"-Infinity"]
_NUMBER = re.compile(rb"(?<![\d.])\d+(?:\.\d+)?")


def _line(lines: List[bytes], rng: random.Random) -> int:
    return rng.randrange(len(lines))


def _flip_bytes(lines: List[bytes], rng: random.Random) -> List[bytes]:
    data = bytearray(b"\n".join(lines) or b"x")
    for _ in range(rng.randint(1, 12)):
        data[rng.randrange(len(data))] = rng.choice([rng.randrange(256), 0, 0xFF, 0x0D, 0x0A, 0x1B, 0x5B])
    return bytes(data).split(b"\n")


def _inflate_digits(lines: List[bytes], rng: random.Random) -> List[bytes]:
    i = _line(lines, rng)
    times = rng.choice([2, 10, 100, 500])
    lines[i] = re.sub(rb"\d+", lambda m: m.group(0) * times, lines[i], count=rng.randint(1, 4))
    return lines


def _duplicate(lines: List[bytes], rng: random.Random) -> List[bytes]:
    i = _line(lines, rng)
    lines[i:i] = [lines[i]] * rng.randint(1, 40)
    return lines


def _truncate(lines: List[bytes], rng: random.Random) -> List[bytes]:
    i = _line(lines, rng)
    lines[i] = lines[i][:rng.randrange(len(lines[i]) + 1)]
    if rng.random() < 0.3:  # the file itself cut short
        del lines[i + 1:]
    return lines


def _shuffle(lines: List[bytes], rng: random.Random) -> List[bytes]:
    if rng.random() < 0.2:
        rng.shuffle(lines)
        return lines
    i = _line(lines, rng)
    window = lines[i:i + rng.randint(2, 20)]
    rng.shuffle(window)
    lines[i:i + len(window)] = window
    return lines


def _number(pool: List[bytes]) -> Callable[[List[bytes], random.Random], List[bytes]]:
    def inject(lines: List[bytes], rng: random.Random) -> List[bytes]:
        candidates = [i for i, line in enumerate(lines) if _NUMBER.search(line)]
        if candidates:
            i = rng.choice(candidates)
            found = list(_NUMBER.finditer(lines[i]))
            m = rng.choice(found)
            lines[i] = lines[i][:m.start()] + rng.choice(pool) + lines[i][m.end():]
        return lines
    return inject


def _delete(lines: List[bytes], rng: random.Random) -> List[bytes]:
    i = _line(lines, rng)
    del lines[i:i + rng.randint(1, 10)]
    return lines or [b""]


def _splice(lines: List[bytes], rng: random.Random) -> List[bytes]:
    """Lines of another real log (often the other engine's) in the middle of this one."""
    other = rng.choice(LOGS).read_bytes().split(b"\n")
    i = _line(lines, rng)
    j = rng.randrange(len(other))
    lines[i:i] = other[j:j + rng.randint(1, 30)]
    return lines


def _glue(lines: List[bytes], rng: random.Random) -> List[bytes]:
    """Lines glued together (a newline lost, as after a progress bar)."""
    i = _line(lines, rng)
    lines[i:i + 2] = [b"".join(lines[i:i + rng.randint(2, 30)])]
    return lines


MUTATORS = (_flip_bytes, _inflate_digits, _duplicate, _truncate, _shuffle, _number(HUGE), _number(HUGE),
            _number(NOT_FINITE), _delete, _splice, _glue)


def mutate(data: bytes, rng: random.Random) -> bytes:
    lines = data.split(b"\n")
    for _ in range(rng.randint(1, 4)):
        lines = rng.choice(MUTATORS)(lines, rng) or [b""]
    return b"\n".join(lines)


def _chunk(k: int) -> range:
    per = -(-FUZZ_CASES // CHUNKS)
    return range(k * per, min(FUZZ_CASES, (k + 1) * per))


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_mutated_real_logs_never_crash_and_json_stays_valid(tmp_path, chunk):
    """Each case runs --json (strict, schema-valid) and one of the other formats in turn, so every
    format sees a quarter of the cases' text paths and JSON sees all of them."""
    path = tmp_path / "mutated.log"
    for case in _chunk(chunk):
        rng = random.Random(FUZZ_SEED * 1_000_003 + case)
        source = rng.choice(LOGS)
        path.write_bytes(mutate(source.read_bytes(), rng))
        try:
            _analyze_everywhere(path, (FORMATS[0], FORMATS[1 + case % 3]))
        except BaseException as exc:  # name the case that reproduces it
            raise AssertionError("case {} (KVF_FUZZ_SEED={}), from {}: {}".format(
                case, FUZZ_SEED, source.name, str(exc)[:2000])) from exc
