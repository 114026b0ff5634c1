"""Every line format in tests/fixtures/line_formats.txt parses to its expected event."""

from __future__ import annotations

from typing import Any, List, Tuple

import pytest

from kvforensics.collectors.logfile import keywords_for
from kvforensics.collectors.sglang.log import GB, GIB, parse_line, split_records
from tests.conftest import FIXTURES


def _cases() -> List[Tuple[int, str, str]]:
    lines = (FIXTURES / "line_formats.txt").read_text(encoding="utf-8").splitlines()
    cases = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip() or line.startswith("#"):
            i += 1
            continue
        assert lines[i + 1].startswith("=> "), "case at line {} lacks an expectation".format(i + 1)
        cases.append((i + 1, line, lines[i + 1][3:]))
        i += 2
    return cases


CASES = _cases()


def _value(text: str) -> Any:
    if text == "None":
        return None
    if text in ("True", "False"):
        return text == "True"
    if text.endswith("GiB"):
        return int(round(float(text[:-3]) * GIB))
    if text.endswith("GB"):
        return int(round(float(text[:-2]) * GB))
    if "," in text:
        return tuple(int(x) for x in text.split(","))
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def _expectations(spec: str) -> Tuple[str, dict]:
    kind, _, rest = spec.partition(" ")
    expected = {}
    # keys are words followed by "="; a value runs to the next " key=" (values may hold spaces)
    import re

    parts = re.split(r" (?=[\w.]+=)", rest) if rest else []
    for part in parts:
        key, _, value = part.partition("=")
        expected[key] = value
    return kind, expected


def test_fixture_has_every_event_kind():
    kinds = {_expectations(spec)[0] for _, _, spec in CASES}
    assert kinds >= {"dist_init_begin", "dist_init_end", "load_begin", "load_end", "kv_dtype", "swa_split",
                     "swa_pool", "kv_pool", "post_capture_kv", "mamba_pool", "pool_end", "graph_begin",
                     "graph_end", "graph_bs", "summary", "server_args", "hicache_host", "failure",
                     "unbalanced", "mfs_adjusted", "requests_reduced", "cap_ignored", "mm_reserve", "none"}
    assert len(CASES) >= 90


@pytest.mark.parametrize("lineno,raw,spec", CASES, ids=[str(c[0]) for c in CASES])
def test_line_format(lineno: int, raw: str, spec: str) -> None:
    events = parse_line(raw, lineno, 0)
    kind, expected = _expectations(spec)
    if kind == "none":
        assert events == []
        return
    assert len(events) == 1, events
    ev = events[0]
    assert ev.kind == kind
    assert ev.line == lineno
    for key, text in expected.items():
        if key == "rank":
            assert ev.rank == (None if text == "None" else text)
        elif key.startswith("args."):
            assert ev.data["args"][key[5:]] == _value(text)
        else:
            assert key in ev.data, (key, ev.data)
            want = _value(text)
            got = ev.data[key]
            if isinstance(want, str) and not isinstance(got, str):
                got = str(got)
            assert got == want, (key, got, want)


@pytest.mark.parametrize("lineno,raw,spec", [c for c in CASES if not c[2].startswith(("none", "load_commit"))],
                         ids=[str(c[0]) for c in CASES if not c[2].startswith(("none", "load_commit"))])
def test_reader_keywords_cover_every_format(lineno: int, raw: str, spec: str) -> None:
    """The reader only parses lines holding a keyword: each recognised format must hold one."""
    assert any(kw.decode() in raw for kw in keywords_for("auto")), raw


def test_ansi_colour_and_crlf_are_stripped():
    raw = "\x1b[32m[2026-01-01 10:00:00 TP1] Memory pool end. avail mem=11.18 GB\x1b[0m\r"
    (ev,) = parse_line(raw)
    assert ev.rank == "TP1" and ev.data["avail_bytes"] == int(round(11.18 * GIB))


def test_glued_records_are_split():
    raw = ("[2026-01-01 10:00:00 TP0] Memory pool end. avail mem=1.00 GB"
           "[2026-01-01 10:00:00 TP1] Memory pool end. avail mem=2.00 GB")
    records = split_records(raw)
    assert [(r[1], r[2]) for r in records] == [("TP0", "Memory pool end. avail mem=1.00 GB"),
                                               ("TP1", "Memory pool end. avail mem=2.00 GB")]


def test_tqdm_redraws_with_carriage_returns():
    raw = "Loading: 10%|#   |\rLoading: 100%|####|\r[2026-01-01 10:00:00 TP0] Load weight begin. avail mem=9.00 GB\r\n"
    (ev,) = parse_line(raw)
    assert ev.kind == "load_begin"


def test_prose_mentioning_the_kv_cache_is_not_a_pool():
    # Not a pool line; but an SGLang record with a memory figure is never dropped silently.
    events = parse_line("[2026-01-01 10:00:00] Note: the KV Cache is allocated. KV size: 1.00 GB per rank")
    assert [e.kind for e in events] == ["unrecognized"]


def test_lines_without_memory_figures_are_not_unrecognized():
    assert parse_line("[2026-01-01 10:00:00 TP0] Decode batch. #running-req: 1, #token: 90, token usage: 0.00") == []


def test_sizes_are_gib_not_decimal():
    (ev,) = parse_line("[2026-01-20 10:00:00 TP0] KV Cache is allocated. #tokens: 159277, KV size: 10.42 GB")
    assert ev.data["kv_bytes"] == 11188389806  # 10.42 * 2**30, not 10.42e9


def test_k_and_v_sizes_add_up():
    (ev,
     ) = parse_line("[2025-07-20 10:00:00 TP0] KV Cache is allocated. #tokens: 367404, K size: 8.23 GB, V size: 8.23 "
                    "GB")
    assert ev.data["kv_bytes"] == ev.data["k_bytes"] + ev.data["v_bytes"] == 2 * int(round(8.23 * GIB))
