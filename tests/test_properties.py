"""Property tests: garbage, truncated and shuffled logs never crash and never invent numbers."""

from __future__ import annotations

import random
import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvforensics.agent.model.analyze import analyze_startup
from kvforensics.agent.model.records import Options
from kvforensics.collectors.sglang.log import GIB, parse_line
from kvforensics.collectors.sglang.startups import StartupSegmenter
from tests.conftest import SEED_LOG

SEED_LINES = SEED_LOG.read_text(encoding="utf-8").splitlines()
NUMBERS = re.compile(r"\d+(?:\.\d+)?")


def _printed(lines):
    """Every number printed in the lines, as it would be read: raw ints and GiB bytes."""
    ints, gibs = set(), set()
    for line in lines:
        for text in NUMBERS.findall(line):
            if "." in text:
                gibs.add(int(round(float(text) * GIB)))
            else:
                ints.add(int(text))
    return ints, gibs


def _analyze_lines(lines):
    seg = StartupSegmenter()
    for n, line in enumerate(lines, 1):
        for ev in parse_line(line, n, n):
            seg.feed(ev)
    return [analyze_startup(s, "file:t", Options()) for s in seg.result()]


def _check_no_invented_numbers(lines):
    ints, gibs = _printed(lines)
    for a in _analyze_lines(lines):
        for r in a.ranks:
            for runner in (r.target, r.draft):
                if runner is None:
                    continue
                for name in ("pre_load_avail_bytes", "post_load_avail_bytes", "pool_end_avail_bytes",
                             "graph_end_avail_bytes", "dist_init_bytes"):
                    value = getattr(runner, name)
                    assert value is None or value in gibs, (name, value)
                assert runner.kv_tokens is None or runner.kv_tokens in ints
        if a.summary.max_total_num_tokens is not None:
            assert a.summary.max_total_num_tokens in ints
        for f in a.findings:
            assert f.severity in ("info", "warning", "error", "critical")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=400))
def test_random_bytes_never_crash(data):
    text = data.decode("utf-8", "replace")
    events = parse_line(text, 1, 0)
    for ev in events:
        assert isinstance(ev.kind, str)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("[]0123456789 "
                                             ".:-=,#TPDGBavilmemusgKVCacheisallocatedtokensLoadweightbeginend")),
               max_size=200))
def test_near_miss_text_never_crashes(text):
    parse_line(text, 1, 0)
    parse_line("[2026-01-01 10:00:00 TP0] " + text, 1, 0)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(min_value=0, max_value=len(SEED_LINES)), st.integers(min_value=0, max_value=len(SEED_LINES)))
def test_truncated_seed_logs(start, end):
    _check_no_invented_numbers(SEED_LINES[min(start, end):max(start, end)])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.randoms(use_true_random=False))
def test_shuffled_seed_logs(rnd: random.Random):
    lines = list(SEED_LINES)
    rnd.shuffle(lines)
    _check_no_invented_numbers(lines)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(min_value=0, max_value=len(SEED_LINES) - 1), st.integers(min_value=1, max_value=200))
def test_lines_cut_mid_way(index, cut):
    lines = list(SEED_LINES)
    lines[index] = lines[index][:cut]
    _check_no_invented_numbers(lines)


def test_fuzzed_numbers_never_crash_and_json_stays_strict(tmp_path):
    """The seed log with numbers swapped for hostile ones (309+ digits, 5,000-digit integers, 0, NaN,
    infinity, a zero context_len, a huge page_size): exit 0/1 with strict JSON, never 4."""
    import json

    from tests.conftest import run_cli

    hostile = ["0", "0.00", "-1", "1" * 400, "9" * 5000, "1e999", "nan", "inf", "99999999999999999999"]
    rng = random.Random(7)
    path = tmp_path / "fuzz.log"
    for _ in range(120):
        out = []
        for line in SEED_LINES:
            if rng.random() < 0.15:
                line = NUMBERS.sub(lambda m: rng.choice(hostile) if rng.random() < 0.5 else m.group(0), line)
            out.append(line.replace("context_len=", "context_len=0") if rng.random() < 0.01 else line)
        path.write_text("\n".join(out) + "\n")
        code, text, err = run_cli(["analyze", str(path), "--json"])
        assert code in (0, 1, 2), err
        if code != 2:
            json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(AssertionError(c)))
