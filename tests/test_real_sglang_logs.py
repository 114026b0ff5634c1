"""Real SGLang logs from public bug reports: every figure right, no false alarm, no crash.

Each excerpt in ``fixtures/real_sglang/`` is kept exactly as pasted (prefixes, cuts and all), with
a sidecar of hand-read figures, the findings a truthful report must make and those it must not
(``forbidden_findings``; ``recommend_raise_mem_fraction`` means: no advice to raise
--mem-fraction-static), and the source URL. ``README.md`` there indexes them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, gib, run_cli

CORPUS = FIXTURES / "real_sglang"
LOGS = sorted(CORPUS.glob("*.log"))

# sidecar key → (runner, field in the JSON report's rank)
RANK_FIGURES = {
    "load_begin_avail_gb": ("target", "pre_load_avail_bytes"),
    "load_end_avail_gb": ("target", "post_load_avail_bytes"),
    "weights_mem_usage_gb": ("target", "weights_bytes"),
    "kv_size_gb": ("target", "kv_bytes"),
    "swakvpool_mem_usage_gb": ("target", "kv_bytes"),  # a hybrid SWA pool's own total, both halves
    "pool_end_avail_gb": ("target", "pool_end_avail_bytes"),
    "dist_init_mem_usage_gb": ("target", "dist_init_bytes"),
    "draft_load_end_avail_gb": ("draft", "post_load_avail_bytes"),
    "draft_weights_mem_usage_gb": ("draft", "weights_bytes"),
}


def _sidecar(log: Path) -> dict:
    return json.loads(log.with_suffix(".json").read_text(encoding="utf-8"))


def _report(log: Path) -> tuple:
    code, out, err = run_cli(["analyze", str(log), "--json"])
    assert code in (0, 1), "exit {}: {}".format(code, err)
    doc = json.loads(out, parse_constant=lambda c: pytest.fail("non-strict JSON constant " + c))
    return code, doc["targets"][0]


def test_the_corpus_is_large_and_sourced():
    assert len(LOGS) >= 20
    for log in LOGS:
        side = _sidecar(log)
        assert side["source_url"].startswith("https://"), log.name
        assert side["outcome"] in ("complete", "fragment", "failed"), log.name


@pytest.mark.parametrize("log", LOGS, ids=[p.stem[:40] for p in LOGS])
def test_findings_tell_the_truth(log):
    side = _sidecar(log)
    _, t = _report(log)
    codes = [f["code"] for f in t["findings"]]
    flags = [r["flag"] for r in t["recommendations"]]
    for code in side["expected_findings"]:
        assert code in codes, "{} missing; got {}".format(code, codes)
    for code in side["forbidden_findings"]:
        if code == "recommend_raise_mem_fraction":
            raised = [r for r in t["recommendations"] if r["flag"] == "--mem-fraction-static"
                      and side["figures"].get("mem_fraction_static") is not None
                      and float(r["value"]) > side["figures"]["mem_fraction_static"]]
            assert not raised, "advises raising --mem-fraction-static: {}".format(flags)
        else:
            assert code not in codes, "false alarm {}".format(code)


@pytest.mark.parametrize("log", LOGS, ids=[p.stem[:40] for p in LOGS])
def test_the_first_finding_says_what_the_startup_came_to(log):
    side = _sidecar(log)
    _, t = _report(log)
    startup = t["startup"]
    first = t["findings"][0]["code"] if t["findings"] else None
    if side["outcome"] == "failed":
        assert first == "startup_failed"
        assert startup["failure"] is not None and startup["complete"] is False
        assert startup["failure"]["stage"] == side["failure"]["stage"]
        assert "unused_gpu_memory" not in [f["code"] for f in t["findings"]]
    elif side["outcome"] == "fragment":
        assert first == "incomplete_startup"
        assert startup["failure"] is None and startup["complete"] is False
        assert "unused_gpu_memory" not in [f["code"] for f in t["findings"]]
        assert not [r for r in t["recommendations"] if r["flag"] == "--mem-fraction-static"]
    else:
        assert startup["complete"] is True and startup["failure"] is None


@pytest.mark.parametrize("log", LOGS, ids=[p.stem[:40] for p in LOGS])
def test_every_hand_read_figure(log):
    side = _sidecar(log)
    _, t = _report(log)
    startup = t["startup"]
    figures = side["figures"]
    for key in ("max_total_num_tokens", "max_running_requests", "context_len"):
        if figures.get(key) is not None:
            assert startup[key] == figures[key], key
    if figures.get("available_gpu_mem_gb") is not None:
        assert startup["startup_avail_bytes"] == gib(figures["available_gpu_mem_gb"])
    ranks = {r["rank"]: r for r in startup["ranks"]}
    for tag, seen in figures["ranks"].items():
        if not set(seen) & (set(RANK_FIGURES) | {"kv_tokens", "k_size_gb"}):
            continue  # only figures a rank ledger does not hold (HiCache host, profiled value, …)
        assert tag in ranks, "rank {!r} not in {}".format(tag, sorted(ranks))
        rank = ranks[tag]
        if isinstance(seen.get("kv_tokens"), int):
            assert rank["kv_tokens"] == seen["kv_tokens"]
        if seen.get("kv_pool_size_known") is False:
            # Only part of the pool's lines is in the excerpt: its size must stay unknown, not a part's.
            assert rank["kv_bytes"] is None, "{} kv_bytes {}".format(tag, rank["kv_bytes"])
        if isinstance(seen.get("k_size_gb"), float) and isinstance(seen.get("v_size_gb"), float):
            assert rank["kv_bytes"] == gib(seen["k_size_gb"]) + gib(seen["v_size_gb"])
        for key, (runner, field) in RANK_FIGURES.items():
            value = seen.get(key)
            if isinstance(value, list):
                value = value[0]  # printed twice: the first is the runner's own
            if not isinstance(value, (int, float)):
                continue
            holder = rank if runner == "target" else rank["draft"]
            assert holder is not None, "{} has no {} runner".format(tag, runner)
            assert holder[field] == gib(value), "{} {}".format(tag, key)
