"""The memory model across eras: budget formula, back-solving, caps, drafts, imbalance, failures."""

from __future__ import annotations

import json
import math

import pytest

from kvforensics.agent.sglang.kv_geometry import GeometryError, geometry
from tests import logbuilder as lb
from tests.conftest import GIB, gib, run_json

QWEN3_235B = {"num_hidden_layers": 94, "num_attention_heads": 64, "num_key_value_heads": 4, "head_dim": 128,
              "hidden_size": 4096, "torch_dtype": "bfloat16"}


def _analyze(tmp_path, lines, *extra):
    log = tmp_path / "x.log"
    lb.write(log, lines)
    code, doc = run_json(["analyze", str(log), "--fail-on", "never", *extra])
    assert code == 0
    return doc["targets"][0]


def _codes(t):
    return {f["code"]: f for f in t["findings"]}


def test_geometry_mha_gqa_replication_and_fp8():
    g = geometry(QWEN3_235B, attn_tp=4)
    assert g.kind == "mha" and g.bytes_per_token == 1 * (128 + 128) * 94 * 2  # 4 KV heads / TP4
    assert geometry(QWEN3_235B, attn_tp=8).bytes_per_token == g.bytes_per_token  # replicated: max(1, 4 // 8)
    assert geometry(QWEN3_235B, attn_tp=1).bytes_per_token == 4 * g.bytes_per_token
    assert geometry(QWEN3_235B, attn_tp=4, kv_cache_dtype="fp8_e4m3").bytes_per_token == g.bytes_per_token // 2


def test_geometry_mla_nsa_and_checkpoint_fp8():
    mla = {"num_hidden_layers": 61, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "torch_dtype": "bfloat16"}
    assert geometry(mla, attn_tp=8).bytes_per_token == 70272
    assert geometry(mla, kv_cache_dtype="fp8_e4m3").bytes_per_token == 35136
    fp8_ckpt = dict(mla, quantization_config={"kv_cache_quant_algo": "FP8"})
    assert geometry(fp8_ckpt).dtype == "fp8_e4m3"
    nsa = dict(mla, index_head_dim=128)
    assert geometry(nsa, kv_cache_dtype="fp8_e4m3").bytes_per_token == (656 + 132) * 61
    with pytest.raises(GeometryError):
        geometry({"num_hidden_layers": 2})


def test_qwen3_235b_mha_log_matches_config(tmp_path):
    """vllm#21348's SGLang line: #tokens 367404, K size 8.23 GB for Qwen3-235B-A22B-FP8 TP4."""
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(QWEN3_235B))
    pre, post = 78.00, 48.00
    mfs = 0.80
    rest = gib(post) - round(gib(pre) * (1 - mfs))
    tokens = rest // 48128
    k = (tokens + 1) * 24064 / GIB
    lines = lb.startup(ranks=("TP0", "TP1", "TP2", "TP3"), tokens=tokens, kv_gib=2 * k, pre=pre, weights=pre - post,
                       args={"model_path": "/q", "mem_fraction_static": mfs, "tp_size": 4, "page_size": 1})
    t = _analyze(tmp_path, lines, "--model-config", str(cfg))
    b = t["startup"]["budget"]
    assert b["bytes_per_token"] == 48128 and b["verdict"] == "agrees"
    assert b["predicted_tokens"] == tokens
    assert _codes(t)["kv_geometry"]["severity"] == "info"


def test_geometry_mismatch_is_reported(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(dict(QWEN3_235B, num_key_value_heads=8)))
    lines = lb.startup(ranks=("TP0", "TP1", "TP2", "TP3"), tokens=367404, kv_gib=16.46,
                       args={"model_path": "/q", "mem_fraction_static": 0.8, "tp_size": 4})
    t = _analyze(tmp_path, lines, "--model-config", str(cfg))
    assert _codes(t)["kv_geometry_mismatch"]["severity"] == "warning"


def test_mem_fraction_is_back_solved_without_server_args(tmp_path):
    # pre 78.50, post 18.50, mfs 0.85 -> reserve 11.775, rest 6.725 GiB at 16,384 B/token
    cell = 16384
    tokens = (gib(18.5) - round(gib(78.5) * 0.15)) // cell
    lines = lb.startup(tokens=tokens, kv_gib=(tokens + 1) * cell / GIB, pre=78.5, weights=60.0)
    t = _analyze(tmp_path, lines)
    b = t["startup"]["budget"]
    assert b["verdict"] == "back-solved"
    assert abs(b["mem_fraction_static"] - 0.85) < 0.001
    assert b["mem_fraction_static_source"].startswith("back-solved")
    assert _codes(t)["mem_fraction_semantics"]["detail"].count("back-solved") == 1


def test_max_total_tokens_cap_explains_a_smaller_pool(tmp_path):
    args = {"model_path": "/m", "mem_fraction_static": 0.85, "tp_size": 2, "max_total_tokens": 50000}
    lines = lb.startup(args=args, tokens=50000, kv_gib=50001 * 16384 / GIB)
    b = _analyze(tmp_path, lines)["startup"]["budget"]
    assert b["verdict"] == "explained" and "--max-total-tokens 50,000" in b["explanation"]
    assert b["predicted_tokens"] == 50000


def test_page_size_rounds_down(tmp_path):
    cell = 16384
    rest = gib(18.5) - round(gib(78.5) * 0.15)
    tokens = rest // cell // 64 * 64
    args = {"model_path": "/m", "mem_fraction_static": 0.85, "tp_size": 2, "page_size": 64}
    lines = lb.startup(args=args, tokens=tokens, kv_gib=(tokens + 64) * cell / GIB, pre=78.5, weights=60.0)
    b = _analyze(tmp_path, lines)["startup"]["budget"]
    assert b["predicted_tokens"] % 64 == 0 and b["verdict"] == "agrees"
    assert any("page_size 64" in s for s in b["steps"])


def test_pool_smaller_than_formula_is_flagged_with_causes(tmp_path):
    args = {"model_path": "/m", "mem_fraction_static": 0.85, "tp_size": 2}
    lines = lb.startup(args=args, tokens=200000, kv_gib=2.0, pre=78.5, weights=60.0)  # far below the budget
    t = _analyze(tmp_path, lines)
    f = _codes(t)["kv_budget_check"]
    assert f["severity"] == "warning" and t["startup"]["budget"]["verdict"] == "differs"
    assert "fewer than the formula allows" in f["detail"] and "minimum across ranks" in f["detail"]


def test_speculative_headroom_before_0_5_7(tmp_path):
    """0.4.4-0.5.6: the EAGLE target pool holds the profiled tokens plus max_num_reqs x (steps x topk + draft) + 100."""
    cell = 16384
    args = {"model_path": "/m", "mem_fraction_static": 0.85, "tp_size": 2, "speculative_algorithm": "EAGLE",
            "speculative_num_steps": 3, "speculative_eagle_topk": 4, "speculative_num_draft_tokens": 8,
            "max_running_requests": 48}
    profiled = (gib(18.5) - round(gib(78.5) * 0.15)) // cell
    tokens = profiled + 48 * 12 + 48 * 8 + 100
    # 0.4.4-0.4.6 graph-end order pins the era
    lines = lb.startup(args=args, tokens=tokens, kv_gib=(tokens + 1) * cell / GIB, pre=78.5, weights=60.0, draft=True,
                       summary="max_total_num_tokens={tokens}, chunked_prefill_size=8192, max_prefill_tokens=16384, "
                               "max_running_requests={reqs}, context_len={ctx}", reqs=48)
    lines = [x.replace("mem usage=1.10 GB. avail mem=8.10 GB.", "avail mem=8.10 GB. mem usage=1.10 GB.") for x in lines]
    t = _analyze(tmp_path, lines)
    b = t["startup"]["budget"]
    assert t["engine"]["version_hint"] == "0.4.4–0.4.6"
    assert any("speculative headroom" in s for s in b["steps"])
    assert b["verdict"] == "agrees", b


@pytest.mark.parametrize("with_config", [False, True])
def test_draft_inside_the_budget_from_0_5_14(tmp_path, with_config):
    """0.5.14+: target load, draft load, then both pools sized from what is left. SGLang 0.5.14–0.5.21
    (pool_configurator.py DefaultPoolConfigurator.__init__) divides by int(target cell × (1 + draft
    layers / target layers)), not by the target's plus the draft's logged bytes."""
    date = "2026-06-26 10:00:00"
    target_cell, draft_cell = 16384, 512
    pre, post_target, post_draft = 78.5, 18.5, 17.5
    rest = gib(post_draft) - round(gib(pre) * 0.15)
    tokens = rest // int(target_cell * (1 + 1 / 4))  # a 1-layer draft over 4 target layers
    args = ("server_args=ServerArgs(model_path='/m', mem_fraction_static=0.85, tp_size=1, "
            "speculative_algorithm='EAGLE3')")
    kv_t = (tokens + 1) * target_cell / GIB
    kv_d = (tokens + 1) * draft_cell / GIB
    lines = ["[{}] {}".format(date, args),
             "[{}] Load weight begin. avail mem={:.2f} GB".format(date, pre),
             "[{}] Load weight end. elapsed=9.00 s, type=LlamaForCausalLM, avail mem={:.2f} GB, mem usage={:.2f} "
             "GB.".format(date, post_target, pre - post_target),
             "[{}] Load weight begin. avail mem={:.2f} GB".format(date, post_target),
             "[{}] Load weight end. elapsed=1.00 s, type=LlamaForCausalLMEagle3, avail mem={:.2f} GB, mem usage=1.00 "
             "GB.".format(date, post_draft),
             "[{}] KV Cache is allocated. dtype: torch.bfloat16, #tokens: {}, K size: {:.2f} GB, V size: {:.2f} "
             "GB".format(date, tokens, kv_t / 2, kv_t / 2),
             "[{}] KV Cache is allocated. dtype: torch.bfloat16, #tokens: {}, K size: {:.2f} GB, V size: {:.2f} "
             "GB".format(date, tokens, kv_d / 2, kv_d / 2),
             "[{}] Memory pool end. avail mem=5.00 GB".format(date),
             "[{}] Memory pool end. avail mem=4.90 GB".format(date),
             "[{}] Capture target decode CUDA graph begin. backend=full, num_tokens_per_bs=1, bs=[1, 2], avail "
             "mem=4.50 GB".format(date),
             "[{}] Capture target decode CUDA graph end. elapsed=9.00 s, mem usage=0.40 GB, avail mem=4.10 "
             "GB.".format(date),
             "[{}] Capture draft decode CUDA graph begin. backend=full, num_tokens_per_bs=1, bs=[1, 2], avail mem=4.10 "
             "GB".format(date),
             "[{}] Capture draft decode CUDA graph end. elapsed=3.00 s, mem usage=0.10 GB, avail mem=4.00 "
             "GB.".format(date),
             "[{}] max_total_num_tokens={}, chunked_prefill_size=8192, max_prefill_tokens=16384, "
             "max_running_requests=256, context_len=32768, available_gpu_mem=3.90 GB".format(date, tokens)]
    extra = []
    if with_config:  # 8 KV heads x (128 + 128) x 4 layers x 2 B = 16,384 B: the target's cell
        cfg = tmp_path / "config.json"
        cfg.write_text(json.dumps({"num_hidden_layers": 4, "num_attention_heads": 32, "num_key_value_heads": 8,
                                   "head_dim": 128, "torch_dtype": "bfloat16"}))
        extra = ["--model-config", str(cfg)]
    t = _analyze(tmp_path, lines, *extra)
    b = t["startup"]["budget"]
    assert t["engine"]["version_hint"] == "0.5.14–0.5.15"
    assert b["draft_in_budget"] is True
    assert b["post_load_avail_min_bytes"] == gib(post_draft)
    if with_config:
        assert b["bytes_per_token"] == 20480
        assert any("1 draft layer(s) / 4 target layers" in step for step in b["steps"])
        assert b["verdict"] == "agrees", b
    else:  # the target's layer count is not in the log: say so rather than guess
        assert b["verdict"] == "unknown" and "--model-config" in b["explanation"], b
    r = t["startup"]["ranks"][0]
    assert r["rank"] == "" and r["kv_bytes"] == 2 * gib(float("{:.2f}".format(kv_t / 2)))
    assert r["draft"]["kv_bytes"] == 2 * gib(float("{:.2f}".format(kv_d / 2)))
    assert r["graph_bytes"] == gib(0.40) and r["draft"]["graph_bytes"] == gib(0.10)
    # workspaces start from the draft's Memory pool end (logged after the target's), so the draft
    # KV allocated in between is not counted twice; the draft's capture follows the target's graphs
    assert r["workspace_bytes"] == gib(4.90) - gib(4.50)
    assert r["draft"]["workspace_bytes"] is None
    assert "draft_in_budget" in _codes(t) and "draft_in_reserve" not in _codes(t)


def test_rank_imbalance_costs_tokens_on_every_rank(tmp_path):
    args = {"model_path": "/m", "mem_fraction_static": 0.85, "tp_size": 4}
    post = {"TP0": 18.5, "TP1": 18.5, "TP2": 15.2, "TP3": 18.5}  # something else holds 3.3 GiB on GPU 2
    lines = lb.startup(ranks=("TP0", "TP1", "TP2", "TP3"), args=args, post=post, pre=78.5)
    t = _analyze(tmp_path, lines)
    f = _codes(t)["rank_imbalance"]
    assert f["bytes"] == gib(18.5) - gib(15.2)
    assert "TP2" in f["detail"] and "minimum" in f["detail"]
    assert t["startup"]["budget"]["post_load_avail_min_bytes"] == gib(15.2)


@pytest.mark.parametrize("line,cause", [
    ("Not enough memory. Please try to increase --mem-fraction-static. Current value: 0.7", "not_enough_memory"),
    ("Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.8. Raise --mem-fraction-static "
     "above 0.842 (minimum viable = 1 - available/pre = 0.8421).", "weights_leave_no_memory"),
    ("Capture cuda graph failed: CUDA error: out of memory", "cuda_graph_capture_failed"),
])
def test_failed_startup_is_reported_with_its_cause(tmp_path, line, cause):
    args = {"model_path": "/m", "mem_fraction_static": 0.7, "tp_size": 2, "cuda_graph_max_bs": 160}
    lines = lb.startup(args=args, pre=78.5, weights=70.0, fail_after_load=line)
    log = tmp_path / "fail.log"
    lb.write(log, lines)
    code, doc = run_json(["analyze", str(log)])
    t = doc["targets"][0]
    assert code == 1
    f = _codes(t)["startup_failed"]
    assert f["severity"] == "critical" and t["startup"]["failure"]["cause"] == cause
    assert f["evidence"] and f["evidence"][0].startswith("line ")
    if cause != "cuda_graph_capture_failed":
        floor = 1 - gib(8.5) / gib(78.5)
        assert "{:.4f}".format(floor) in f["detail"]
        rec = t["recommendations"][0]
        assert rec["flag"] == "--mem-fraction-static" and float(rec["value"]) > floor
    else:
        assert t["recommendations"][0] == {**t["recommendations"][0], "flag": "--cuda-graph-max-bs", "value": "80"}
    assert not any(r["flag"] == "--kv-cache-dtype" for r in t["recommendations"])


def test_low_headroom_from_the_log_alone_is_a_note_not_a_cut(tmp_path):
    """0.60 GiB free after a startup that finished: the server runs as sized, and the log shows no pressure."""
    args = {"model_path": "/m", "mem_fraction_static": 0.95, "tp_size": 2}
    t = _analyze(tmp_path, lb.startup(args=args, final=0.60))
    f = _codes(t)["low_headroom"]
    assert f["bytes"] == gib(0.60) and f["severity"] == "info" and "watch it, no cut is advised" in f["title"]
    assert not [r for r in t["recommendations"] if r["flag"] == "--mem-fraction-static"]
    assert t["verdict"]["action"].startswith("watch the low-water mark with `kvforensics record`")


def test_request_slots_bound_recommends_more_slots(tmp_path):
    args = {"model_path": "/m", "mem_fraction_static": 0.85, "tp_size": 2, "max_running_requests": 8}
    t = _analyze(tmp_path, lb.startup(args=args, tokens=400000, reqs=8), "--request-tokens", "4096")
    f = _codes(t)["concurrency_bound"]
    assert "Request slots bound concurrency" in f["title"]
    rec = next(r for r in t["recommendations"] if r["flag"] == "--max-running-requests")
    assert rec["value"] == str(400000 // 4096) and rec["gain_requests"]["at_request_tokens"] == 400000 // 4096 - 8


def test_secrets_in_server_args_are_redacted(tmp_path):
    args = {"model_path": "/m", "mem_fraction_static": 0.85, "tp_size": 2, "api_key": "sk-live-123",
            "admin_api_key": "adm-9", "hf_token": "hf_abc", "max_total_tokens": None, "speculative_num_draft_tokens": 4}
    log = tmp_path / "x.log"
    lb.write(log, lb.startup(args=args))
    code, doc = run_json(["analyze", str(log), "--fail-on", "never"])
    text = json.dumps(doc)
    assert "sk-live-123" not in text and "adm-9" not in text and "hf_abc" not in text
    sa = doc["targets"][0]["engine"]["server_args"]
    assert sa["api_key"] == "<redacted>" and sa["speculative_num_draft_tokens"] == 4


def test_gain_tokens_follow_the_formula(tmp_path):
    args = {"model_path": "/m", "mem_fraction_static": 0.80, "tp_size": 2}
    t = _analyze(tmp_path, lb.startup(args=args, final=9.0, pre=78.5), "--margin", "1.5")
    rec = next(r for r in t["recommendations"] if r["flag"] == "--mem-fraction-static")
    new = math.floor((0.80 + (gib(9.0) - 1.5 * GIB) / gib(78.5)) * 1000) / 1000
    assert rec["value"] == "{:.3f}".format(new)
    assert rec["gain_tokens"] == rec["gain_bytes"] // t["startup"]["budget"]["bytes_per_token"]


def test_sglang_adjustments_become_findings(tmp_path):
    args = {"model_path": "/m", "mem_fraction_static": 0.85, "tp_size": 2}
    lines = lb.startup(args=args)
    date = "2025-06-24 10:00:00"
    lines[1:1] = ["[{}] Multimodal model: Dynamically adjusted --mem-fraction-static from: 0.881 to: 0.85".format(date)]
    lines += ["[{} TP0] max_running_requests was reduced from the requested 512 to 128 (per dp worker) due to the "
              "available KV cache capacity.".format(date),
              "[{} TP0] Allocating 60.00 GB host memory for hierarchical KV cache.".format(date)]
    codes = {f["code"]: f for f in _analyze(tmp_path, lines)["findings"]}
    assert "0.881 to 0.85" in codes["mem_fraction_adjusted"]["title"]
    assert codes["max_running_requests_reduced"]["severity"] == "warning"
    assert codes["hicache_host_pool"]["bytes"] == 60 * 10**9  # decimal GB


def test_hybrid_sliding_window_pools_are_budgeted_per_full_token(tmp_path):
    """0.5.7+ hybrid SWA: a split line, then pool lines whose #tokens is the SWA count."""
    date = "2026-01-31 13:50:39"
    full, swa = 375360, 300288  # swa = full x 0.8, page 64
    cell_full, cell_swa = 24576, 40960  # bytes per token in each pool (different heads/dims)
    pre, post, mfs = 78.5, 30.0, 0.7
    rest = gib(post) - round(gib(pre) * (1 - mfs))
    full = rest // (cell_full + int(0.8 * cell_swa)) // 64 * 64
    swa = int(full * 0.8) // 64 * 64
    full_gib = (full + 64) * cell_full / GIB
    swa_gib = (swa + 64) * cell_swa / GIB
    args = "server_args=ServerArgs(model_path='/m', mem_fraction_static={}, tp_size=1, page_size=64)".format(mfs)
    lines = ["[{}] {}".format(date, args),
             "[{}] Load weight begin. avail mem={:.2f} GB".format(date, pre),
             "[{}] Load weight end. type=MiMoV2FlashForCausalLM, dtype=torch.bfloat16, avail mem={:.2f} GB, mem "
             "usage={:.2f} GB.".format(date, post, pre - post),
             "[{}] Use sliding window memory pool. full_layer_tokens={}, swa_layer_tokens={}".format(date, full, swa),
             "[{}] KV Cache is allocated. #tokens: {}, K size: {:.2f} GB, V size: {:.2f} GB".format(date, swa,
                                                                                                    swa_gib / 2,
                                                                                                    swa_gib / 2),
             "[{}] KV Cache is allocated. #tokens: {}, K size: {:.2f} GB, V size: {:.2f} GB".format(date, full,
                                                                                                    full_gib / 2,
                                                                                                    full_gib / 2),
             "[{}] Memory pool end. avail mem=5.00 GB".format(date),
             "[{}] max_total_num_tokens={}, chunked_prefill_size=8192, max_prefill_tokens=16384, "
             "max_running_requests=256, context_len=32768, available_gpu_mem=4.00 GB".format(date, full)]
    b = _analyze(tmp_path, lines)["startup"]["budget"]
    assert b["logged_tokens"] == full
    assert "hybrid SWA" in b["bytes_per_token_source"]
    assert b["verdict"] == "agrees", b


def test_swakvpool_total_is_the_pool_when_a_fragment_starts_after_its_swa_half(tmp_path):
    """'SWAKVPool mem usage' prints both halves' sum (SWAKVPool.__init__): it is the rank's pool even
    when the SWA half's own line is before the excerpt; its full size is the token count."""
    date = "2025-12-19 07:42:57"
    lines = ["[{} TP0] KV Cache is allocated. #tokens: 1000, K size: 4.82 GB, V size: 3.21 GB".format(date),
             "[{} TP0] SWAKVPool mem usage: 77.63 GB, swa size: 800, full size: 1000".format(date),
             "[{} TP0] Memory pool end. avail mem=22.59 GB".format(date)]
    t = _analyze(tmp_path, lines)
    (rank,) = t["startup"]["ranks"]
    assert rank["kv_bytes"] == gib(77.63) and rank["kv_tokens"] == 1000
    assert t["startup"]["budget"]["bytes_per_token"] == round(gib(77.63) / 1001)


def test_only_the_swa_half_of_a_hybrid_pool_leaves_its_size_unknown(tmp_path):
    """A fragment cut after the SWA half's KV line: that line's bytes are not the pool's."""
    date = "2026-01-31 13:50:39"
    lines = ["[{} TP1] Use sliding window memory pool. full_layer_tokens=375360, swa_layer_tokens=300288".format(date),
             "[{} TP1] KV Cache is allocated. #tokens: 300288, K size: 8.38 GB, V size: 5.59 GB".format(date)]
    t = _analyze(tmp_path, lines)
    (rank,) = t["startup"]["ranks"]
    assert rank["kv_bytes"] is None and rank["kv_tokens"] == 375360
    assert t["startup"]["budget"]["bytes_per_token"] is None
    assert any(p["code"] == "log.kv_pool_half" and "TP1" in p["message"] for p in t["problems"])


@pytest.mark.parametrize("mamba, expected", [
    ("max_mamba_cache_size: 82, conv_state size: 0.13GB, ssm_state size: 7.29GB", "27"),  # 82 // 3
    ("conv_state size: 0.13 GB, ssm_state size: 7.29 GB", None),  # 0.5.2-0.5.3: pool size not printed
])
def test_mamba_pool_caps_the_max_running_requests_advice(tmp_path, mamba, expected):
    """SGLang clamps max_running_requests to max_mamba_cache_size // 3 (radix cache on): advising the
    KV pool's 70 would be cut back; without the pool's size the cap is unknown and nothing is advised."""
    date = "2026-02-27 17:10:28"
    lines = ["[{} TP0] Mamba Cache is allocated. {}".format(date, mamba),
             "[{} TP0] KV Cache is allocated. #tokens: 580364, K size: 4.15 GB, V size: 4.15 GB".format(date),
             "[{} TP0] Memory pool end. avail mem=4.02 GB".format(date),
             "[{} TP0] max_total_num_tokens=580364, chunked_prefill_size=2048, max_prefill_tokens=16384, "
             "max_running_requests=1, context_len=8192, available_gpu_mem=3.63 GB".format(date)]
    recs = [r for r in _analyze(tmp_path, lines)["recommendations"] if r["flag"] == "--max-running-requests"]
    assert [r["value"] for r in recs] == ([expected] if expected else [])
