"""One number, one value: findings and recommendations quote one computation; gains too small to be
worth a restart are not advised; unknown figures are shown as "—", never 0."""

from __future__ import annotations

from tests import logbuilder
from tests.conftest import GIB, SEED_CONFIG, SEED_LOG, run_json

ARGS = {"model_path": "/models/m", "tp_size": 2, "mem_fraction_static": 0.9}


def _seed():
    code, doc = run_json(["analyze", str(SEED_LOG), "--model-config", str(SEED_CONFIG)])
    return doc["targets"][0]


def _finding(t, code):
    return next((f for f in t["findings"] if f["code"] == code), None)


def _rec(t, flag):
    return next((r for r in t["recommendations"] if r["flag"].startswith(flag)), None)


def test_the_unused_finding_quotes_the_raise_it_recommends():
    t = _seed()
    rec, f = _rec(t, "--mem-fraction-static"), _finding(t, "unused_gpu_memory")
    quoted = "--mem-fraction-static {} puts {:.2f} GiB of it into the KV pool: +{:,} KV tokens".format(
        rec["value"], rec["gain_bytes"] / GIB, rec["gain_tokens"])
    assert quoted in f["detail"]
    assert f["bytes"] >= rec["gain_bytes"]  # the finding is the spare; the raise is what the rounding leaves of it
    # the rounding of the fraction is explained once, in the recommendation
    assert "rounded down to 3 decimals" in rec["rationale"]
    assert "rounded down" not in f["detail"]


def test_hicache_size_is_the_size_the_text_explains():
    rec = _rec(_seed(), "--enable-hierarchical-cache")
    size = int(rec["value"])
    assert size == 23  # 2 × the 10.42 GiB pool = 22.37 GB, rounded up
    assert "{} GB per rank".format(size) in rec["rationale"] and "22 GB per rank" not in rec["rationale"]
    assert rec["gain_tokens"] == size * 10**9 // 70272  # the tokens that size holds


def _analyze(tmp_path, **kw):
    log = tmp_path / "s.log"
    logbuilder.write(log, logbuilder.startup(args=ARGS, **kw))
    code, doc = run_json(["analyze", str(log)])
    return doc["targets"][0]


def test_no_raise_worth_less_than_five_percent_of_the_pool(tmp_path):
    # 0.6 GiB spare on a 32 GiB pool: a raise of ~1.7% of the pool is not worth a restart
    t = _analyze(tmp_path, tokens=400000, kv_gib=32.0, final=2.6, pre=78.5, weights=30.0)
    assert _rec(t, "--mem-fraction-static") is None and _finding(t, "unused_gpu_memory") is None
    # the same pool with 5.8 GiB spare is
    t = _analyze(tmp_path, tokens=400000, kv_gib=32.0, final=7.8, pre=78.5, weights=30.0)
    rec = _rec(t, "--mem-fraction-static")
    assert rec is not None and rec["gain_tokens"] >= 0.05 * 400000
    assert _finding(t, "unused_gpu_memory") is not None


def test_no_hicache_tier_under_four_gb_per_rank(tmp_path):
    t = _analyze(tmp_path, kv_gib=1.0, tokens=12000)  # 2 × 1 GiB = 2.15 GB per rank
    assert _rec(t, "--enable-hierarchical-cache") is None
    t = _analyze(tmp_path, kv_gib=8.0)
    assert int(_rec(t, "--enable-hierarchical-cache")["value"]) >= 4


def test_unknown_figures_are_a_dash():
    from collectors.units import gib, gib_number

    assert gib(None) == gib_number(None) == "—"
