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
    from kvforensics.collectors.units import gib, gib_number

    assert gib(None) == gib_number(None) == "—"


V0_LOG = SEED_LOG.parent / "vllm-v0-complete.log"
VLLM_NODE = SEED_LOG.parent / "vllm-node.json"


def _target(argv):
    return run_json(argv)[1]["targets"][0]


def test_a_margin_beyond_the_gpu_is_said_not_turned_into_a_negative_fraction():
    t = _target(["analyze", str(SEED_LOG), "--model-config", str(SEED_CONFIG), "--margin", "200GiB"])
    assert _rec(t, "--mem-fraction-static") is None  # was --mem-fraction-static -1.191
    assert _finding(t, "low_headroom")["detail"].endswith(
        "so its KV budget is not cut on that alone; no --mem-fraction-static keeps the 200.00 GiB margin: it is "
        "more than the 94.04 GiB the GPU had free before the weights loaded.")
    v = t["verdict"]
    assert (v["symptom_finding"], v["action_recommendation"]) == ("low_headroom", None)
    assert v["action"] == ("none: the 200.00 GiB margin exceeds the GPU (94.04 GiB free before loading); check "
                           "--margin (from finding low_headroom)")
    t = _target(["analyze", str(V0_LOG), "--margin", "200GiB"])
    assert _rec(t, "--gpu-memory-utilization") is None
    assert t["verdict"]["action"] == ("none: the 200.00 GiB margin exceeds the GPU (79.19 GiB total); check --margin "
                                      "(from finding low_headroom)")


def test_a_cut_that_would_leave_no_kv_pool_is_not_advised():
    """5.31 GiB free, a 20 GiB margin: giving back 14.69 GiB is more than the 10.43 GiB KV budget holds."""
    t = _target(["analyze", str(SEED_LOG), "--model-config", str(SEED_CONFIG), "--margin", "20GiB"])
    assert _rec(t, "--mem-fraction-static") is None
    assert "no --mem-fraction-static keeps the 20.00 GiB margin: giving back 14.69 GiB would leave no KV budget (it " \
        "is 10.43 GiB)" in _finding(t, "low_headroom")["detail"]
    assert t["verdict"]["action"] == ("none: no --mem-fraction-static keeps a 20.00 GiB margin and a KV pool; use more "
                                      "GPUs (--tp-size) or check --margin")


def test_fraction_flags_are_only_ever_advised_inside_zero_one():
    for log in (["analyze", str(SEED_LOG), "--model-config", str(SEED_CONFIG)], ["analyze", str(V0_LOG)]):
        for margin in ("0", "0.5", "2", "5", "8", "12", "15", "20", "50", "78", "79.5", "95", "200"):
            t = _target(log + ["--margin", margin + "GiB"])
            for r in t["recommendations"]:
                if r["flag"] in ("--mem-fraction-static", "--gpu-memory-utilization"):
                    assert 0 < float(r["value"]) < 1, (margin, r)


def test_vllm_raise_arithmetic_adds_up_and_says_where_it_rounds():
    """15.20 GiB − 2.00 GiB = 13.20 GiB spare; 0.8 + 13.20/79.19 ≈ 0.9666, rounded down to 0.96; 0.16 ×
    79.19 GiB = 12.67 GiB: every step of the text is there, the rounding where it is applied."""
    t = _target(["analyze", str(V0_LOG)])
    rec = _rec(t, "--gpu-memory-utilization")
    assert rec["rationale"] == (
        "15.20 GiB outside the budget after startup (total_gpu_memory − the budget (line 2 (worker.py:294)) − the "
        "CUDA graph pool outside it (line 7 (model_runner.py:1671)) − the CUDA context (~527 MiB, not in the log: "
        "measured on an H200)) − 2.00 GiB margin = 13.20 GiB spare; u 0.8 + 13.20 GiB ÷ T 79.19 GiB ≈ 0.9666, "
        "rounded down to 0.01 so the budget never grows by more than the spare: 0.96 (u 0.8 from the log); "
        "(0.96 − 0.8) × 79.19 GiB = 12.67 GiB more budget, and as much more KV cache, per worker = +118,619 KV "
        "tokens (36,184 GPU blocks × 16 tokens per block (the size line 5's concurrency implies) in 61.84 GiB of KV "
        "cache memory (line 3 (worker.py:294)): 9,361 tokens per GiB).")
    assert "leaves 13.20 GiB the KV pool could use; --gpu-memory-utilization 0.96 puts 12.67 GiB of it into the KV " \
        "pool: +118,619 KV tokens (recommended below)." in _finding(t, "unused_gpu_memory")["detail"]


def test_v0_block_size_comes_from_the_concurrency_line_or_not_at_all(tmp_path):
    """executor_base.py initialize_cache prints blocks × block_size ÷ max_model_len: the one whole block
    size that prints as the logged figure is the log's; when none (or two) do, no tokens are claimed."""
    text = V0_LOG.read_text(encoding="utf-8")
    log = tmp_path / "v0.log"
    log.write_text(text.replace("70.67x", "282.69x"), encoding="utf-8")  # 36,184 × 64 ÷ 8,192 (FlashMLA's 64)
    rec = _rec(_target(["analyze", str(log)]), "--gpu-memory-utilization")
    assert rec["gain_tokens"] == 13604738407 * 36184 * 64 // int(round(61.84 * GIB))
    log.write_text(text.replace("70.67x", "70.60x"), encoding="utf-8")  # no whole block size prints as 70.60
    t = _target(["analyze", str(log)])
    rec = _rec(t, "--gpu-memory-utilization")
    assert rec["gain_bytes"] == 13604738407 and rec["gain_tokens"] is None
    assert rec["gain_requests"] == {"at_context_len": None, "at_request_tokens": None}
    assert rec["rationale"].endswith("per worker (KV tokens unknown: the log gives no KV cache size to scale).")
    assert t["verdict"]["action"] == ("--gpu-memory-utilization 0.96: +12.67 GiB per rank (estimated; "
                                      "recommendation 1 of 1)")


def test_vllm_node_raise_is_in_tokens_too_and_the_finding_quotes_it():
    """Live V1: 'GPU KV cache size: 355,200 tokens' in 54.20 GiB of KV memory; the finding and the raise size
    the change from the same NVML CUDA total and the running server's u, so they quote the same figures."""
    t = _target(["inspect", "--from", str(VLLM_NODE)])
    rec = _rec(t, "--gpu-memory-utilization")
    assert (rec["value"], rec["gain_bytes"]) == ("0.96", 9006592819)
    assert rec["gain_tokens"] == 9006592819 * 355200 // int(round(54.20 * GIB)) == 54971
    assert rec["gain_requests"] == {"at_context_len": 1, "at_request_tokens": 7}  # 355,200 → 410,171 tokens
    assert "--gpu-memory-utilization 0.96 puts 8.39 GiB of it into the KV pool: +54,971 KV tokens per rank" in \
        _finding(t, "unused_gpu_memory")["detail"]
    assert "u 0.9 + 9.47 GiB ÷ T 139.80 GiB ≈ 0.9677, rounded down to 0.01 so the budget never grows by more " \
        "than the spare: 0.96 (u 0.9 from the running server); (0.96 − 0.9) × 139.80 GiB = 8.39 GiB more budget" \
        in rec["rationale"]
