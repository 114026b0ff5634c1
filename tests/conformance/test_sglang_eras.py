"""Conformance: SGLang's own arithmetic, release by release.

Each test writes one startup in the line formats of a release era (format strings read from the
published wheels, ``pip download sglang==X --no-deps``), computes the expected KV token count
here with SGLang's formula for that release (the function is cited beside it), and checks that
kvforensics lands on it: inside its predicted interval, verdict ``agrees``.

Common inputs: free memory 80.00 GiB before the weights and 40.00 GiB after (both print exactly),
--mem-fraction-static 0.88, so SGLang's ``rest`` is 40 − 80 × 0.12 = 30.4 GiB.
"""

from __future__ import annotations

import json
import math
from typing import Dict, List

import pytest

from kvforensics.agent.sglang.era import Era
from kvforensics.agent.sglang.kv_geometry import geometry
from tests.conftest import GIB, run_cli, run_json

PRE, POST, MFS = 80.0, 40.0, 0.88
REST_GIB = POST - PRE * (1 - MFS)  # 30.4, a float as SGLang computes it (get_available_gpu_memory is GiB)
LLAMA_8B = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
            "hidden_size": 4096, "torch_dtype": "bfloat16"}
KIMI_MLA = {"num_hidden_layers": 61, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "torch_dtype": "bfloat16"}
MHA_CELL = 8 * 128 * 32 * 2 * 2  # kv_heads × head_dim × layers × (K, V) × bf16 = 131,072 B
MLA_CELL = (512 + 64) * 61 * 2  # (kv_lora_rank + rope) × layers × bf16 = 70,272 B


def _profiled(cell: int) -> int:
    """model_runner.py profile_max_num_token (≤0.5.6: int(rest × 2**30 // cell)); 0.5.7+ int(rest × 2**30)
    // cell; 0.5.11+ available_bytes // cell (pool_configurator.py) — the same integer for rest > 0."""
    return int(REST_GIB * (1 << 30)) // cell


def _gb(n_bytes: float) -> str:
    return "{:.2f}".format(n_bytes / GIB)


def _analyze(tmp_path, lines: List[str], *extra: str) -> Dict:
    log = tmp_path / "startup.log"
    log.write_text("\n".join(lines) + "\n")
    code, doc = run_json(["analyze", str(log), "--fail-on", "never", *extra])
    assert code == 0
    return doc["targets"][0]


def _loaded(d: str, args: str) -> List[str]:
    """A 0.5.13+ launch up to the weights: server_args, then Load weight begin/end (PRE → POST GiB free)."""
    return ["[{}] server_args={}".format(d, args),
            "[{}] Load weight begin. avail mem={:.2f} GB".format(d, PRE),
            "[{}] Load weight end. elapsed=9.00 s, type=LlamaForCausalLM, quant=None, avail mem={:.2f} GB, "
            "mem usage=39.20 GB.".format(d, POST)]


def _config(tmp_path, cfg: Dict) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def _agrees(t: Dict, expected: int) -> Dict:
    b = t["startup"]["budget"]
    assert b["predicted_tokens_low"] <= expected <= b["predicted_tokens_high"], b
    assert b["logged_tokens"] == expected
    assert b["verdict"] == "agrees", b
    return b


def test_0_2_15_to_0_3_0_time_only_prefix_no_kv_line(tmp_path):
    """0.2.15–0.3.0: `[HH:MM:SS TPn]`, 'Init nccl begin.', no KV line; the summary carries T. Cell from
    the config (model_runner.py profile_max_num_token: kv_heads × head_dim × layers × 2 × elem);
    req_to_token: R rows (default cap 5120 up to 0.3.0) × (context_len + 8)."""
    t_exp = _profiled(MHA_CELL)
    args = "ServerArgs(model_path='/m', mem_fraction_static={}, tp_size=1)".format(MFS)
    lines = ["[10:00:00] server_args={}".format(args), "[10:00:01 TP0] Init nccl begin.",
             "[10:00:02 TP0] Load weight begin. avail mem={:.2f} GB".format(PRE),
             "[10:00:09 TP0] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem={:.2f} "
             "GB".format(POST),
             "[10:00:10 TP0] Memory pool end. avail mem=9.20 GB",
             "[10:00:11 TP0] max_total_num_tokens={}, max_prefill_tokens=16384, max_running_requests=2047, "
             "context_len=8192".format(t_exp)]
    t = _analyze(tmp_path, lines, "--model-config", _config(tmp_path, LLAMA_8B))
    assert t["engine"]["version_hint"] == "0.2.15–0.3.0"
    _agrees(t, t_exp)
    # R = min(max(int(T/C × 512), 2048), 5120) from the capped T (≤0.4.1); no extra row up to 0.3.1
    r = min(max(int(t_exp / 8192 * 512), 2048), 5120)
    assert t["startup"]["ranks"][0]["req_to_token_bytes"] == r * (8192 + 8) * 4


def test_0_4_2_to_0_4_3_cap_and_req_to_token_rows(tmp_path):
    """0.4.2–0.4.3: K/V line without #tokens, summary with chunked_prefill_size; --max-total-tokens caps
    T after profiling (model_runner.py init_memory_pool); req_to_token has R + 1 rows (0.3.2–0.4.6.post5)
    with R from the profiled, uncapped T (0.4.2–0.5.9) and context_len + 4 columns."""
    cap, ctx = 100000, 32768
    kv = (cap + 1) * MHA_CELL / 2  # buffers hold #tokens + page_size rows (memory_pool.py)
    args = "ServerArgs(model_path='/m', mem_fraction_static={}, tp_size=1, max_total_tokens={})".format(MFS, cap)
    d = "2025-01-27 10:00:00"
    lines = ["[{}] server_args={}".format(d, args), "[{} TP0] Init torch distributed begin.".format(d),
             "[{} TP0] Load weight begin. avail mem={:.2f} GB".format(d, PRE),
             "[{} TP0] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem={:.2f} GB".format(d,
                                                                                                                 POST),
             "[{} TP0] KV Cache is allocated. K size: {} GB, V size: {} GB.".format(d, _gb(kv), _gb(kv)),
             "[{} TP0] Memory pool end. avail mem=20.00 GB".format(d),
             "[{} TP0] max_total_num_tokens={}, chunked_prefill_size=8192, max_prefill_tokens=16384, "
             "max_running_requests=4097, context_len={}".format(d, cap, ctx)]
    t = _analyze(tmp_path, lines, "--model-config", _config(tmp_path, LLAMA_8B))
    assert t["engine"]["version_hint"] == "0.4.2–0.4.3"
    b = t["startup"]["budget"]
    assert b["verdict"] == "explained" and "capped by --max-total-tokens" in b["explanation"], b
    profiled = _profiled(MHA_CELL)
    r = min(max(int(profiled / ctx * 512), 2048), 4096)
    assert t["startup"]["ranks"][0]["req_to_token_bytes"] == (r + 1) * (ctx + 4) * 4


def test_0_4_4_to_0_5_6_eagle_headroom_is_added(tmp_path):
    """0.4.3.post4–0.5.6: an EAGLE target pool holds T + R × steps × topk + R × draft tokens + 100, before
    the cap and page rounding (model_runner.py init_memory_pool, draft_runner_cache_size); R is the
    default max_num_reqs from the profiled T, not the req_to_token rows."""
    ctx, steps, topk, draft = 131072, 3, 1, 4
    profiled = _profiled(MHA_CELL)
    r = min(max(int(profiled / ctx * 512), 2048), 4096)
    t_exp = profiled + r * steps * topk + r * draft + 100  # worked example: 263,472
    assert t_exp == 263472
    kv = (t_exp + 1) * MHA_CELL / 2
    args = ("ServerArgs(model_path='/m', mem_fraction_static={}, tp_size=1, speculative_algorithm='EAGLE', "
            "speculative_num_steps={}, speculative_eagle_topk={}, speculative_num_draft_tokens={})").format(
                MFS, steps, topk, draft)
    d = "2025-04-07 10:00:00"
    lines = ["[{}] server_args={}".format(d, args),
             "[{} TP0] Init torch distributed ends. mem usage=0.80 GB".format(d),
             "[{} TP0] Load weight begin. avail mem={:.2f} GB".format(d, PRE),
             "[{} TP0] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem={:.2f} GB, "
             "mem usage=39.20 GB.".format(d, POST),
             "[{} TP0] KV Cache is allocated. #tokens: {}, K size: {} GB, V size: {} GB".format(d, t_exp, _gb(kv),
                                                                                                _gb(kv)),
             "[{} TP0] Memory pool end. avail mem=7.00 GB".format(d),
             "[{} TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=6.80 GB".format(d),
             "[{} TP0] Capture cuda graph end. Time elapsed: 20.00 s. avail mem=6.00 GB. mem usage=0.80 GB.".format(d),
             "[{} TP0] max_total_num_tokens={}, chunked_prefill_size=8192, max_prefill_tokens=16384, "
             "max_running_requests={}, context_len={}".format(d, t_exp, r, ctx)]
    t = _analyze(tmp_path, lines)
    assert t["engine"]["version_hint"] == "0.4.4–0.4.6"
    b = _agrees(t, t_exp)
    assert any("speculative headroom 2048 (default max_num_reqs) × 3 steps" in s for s in b["steps"])


@pytest.mark.parametrize("straddle", [False, True])
def test_0_5_7_to_0_5_13_draft_after_the_pool_no_headroom(tmp_path, straddle):
    """0.5.7+: no headroom (model_runner_kv_cache_mixin.py init_memory_pool: draft_runner_cache_size = T);
    the draft loads after the target pool and lives in the reserve. With line formats that allow
    0.5.6–0.5.8 (straddle), both predictions are computed and the log's pool picks 0.5.7–0.5.8."""
    profiled = _profiled(MHA_CELL)
    kv = (profiled + 1) * MHA_CELL / 2
    args = ("ServerArgs(model_path='/m', mem_fraction_static={}, tp_size=1, speculative_algorithm='EAGLE3', "
            "speculative_num_steps=3, speculative_eagle_topk=1, speculative_num_draft_tokens=4)").format(MFS)
    d = "2026-01-01 10:00:00.100" if straddle else "2026-06-11 10:00:00"
    if straddle:  # 0.5.6–0.5.8 shapes: ms timestamps, 'ends. mem usage', load end with mem usage, no elapsed
        dist = "Init torch distributed ends. mem usage=0.80 GB"
        end = "Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem={:.2f} GB, mem usage=39.20 GB."
        kv_line = "KV Cache is allocated. #tokens: {}, K size: {} GB, V size: {} GB"
    else:  # 0.5.13: 'ends. elapsed', load end with quant=, KV line with dtype:
        dist = "Init torch distributed ends. elapsed=3.00 s, mem usage=0.80 GB"
        end = ("Load weight end. elapsed=9.00 s, type=LlamaForCausalLM, quant=None, avail mem={:.2f} GB, "
               "mem usage=39.20 GB.")
        kv_line = "KV Cache is allocated. dtype: torch.bfloat16, #tokens: {}, K size: {} GB, V size: {} GB"
    lines = ["[{}] server_args={}".format(d, args), "[{} TP0] {}".format(d, dist),
             "[{} TP0] Load weight begin. avail mem={:.2f} GB".format(d, PRE), "[{} TP0] {}".format(d,
                                                                                                    end.format(POST)),
             "[{} TP0] {}".format(d, kv_line.format(profiled, _gb(kv), _gb(kv))),
             "[{} TP0] Memory pool end. avail mem=7.00 GB".format(d),
             "[{} TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=6.90 GB".format(d),
             "[{} TP0] Capture cuda graph end. Time elapsed: 20.00 s. mem usage=0.50 GB. avail mem=6.40 GB.".format(d),
             "[{} TP0] Load weight begin. avail mem=6.40 GB".format(d),
             "[{} TP0] {}".format(d, end.format(6.0).replace("LlamaForCausalLM", "LlamaForCausalLMEagle3").replace(
                 "39.20", "1.00")),
             "[{} TP0] max_total_num_tokens={}, chunked_prefill_size=8192, max_prefill_tokens=16384, "
             "max_running_requests=2048, context_len=131072, available_gpu_mem=4.00 GB".format(d, profiled)]
    t = _analyze(tmp_path, lines)
    b = _agrees(t, profiled)
    if straddle:
        assert t["engine"]["version_hint"] == "0.5.6–0.5.8"
        assert "the logged pool fits 0.5.7–0.5.8" in b["explanation"], b
    else:
        assert t["engine"]["version_hint"] == "0.5.13"
    assert "draft_in_reserve" in [f["code"] for f in t["findings"]]


@pytest.mark.parametrize("with_config", [True, False])
def test_0_5_14_mla_target_with_an_mha_eagle3_draft(tmp_path, with_config):
    """0.5.14–0.5.21: draft weights load before profiling, and the cell is int(target cell × (1 + draft
    layers / target layers)) (pool_configurator.py DefaultPoolConfigurator.__init__), the MLA per-layer
    size scaled, not the draft's own MHA bytes. Kimi-K2.5 shape: 61 MLA layers, a 1-layer EAGLE-3 draft."""
    cell = int(MLA_CELL * (1 + 1 / 61))
    assert cell == 71424
    post_draft = 39.0
    rest = post_draft - PRE * (1 - MFS)
    t_exp = int(rest * (1 << 30)) // cell
    kv_target = (t_exp + 1) * MLA_CELL
    kv_draft = (t_exp + 1) * 8 * 128 * 2 * 2  # the draft's real MHA pool: bigger than what was budgeted
    d = "2026-06-26 10:00:00"
    args = "ServerArgs(model_path='/m', mem_fraction_static={}, tp_size=1, speculative_algorithm='EAGLE3')".format(MFS)
    lines = ["[{}] server_args={}".format(d, args),
             "[{}] Load weight begin. avail mem={:.2f} GB".format(d, PRE),
             "[{}] Load weight end. elapsed=9.00 s, type=KimiK25ForConditionalGeneration, quant=None, avail mem={:.2f} "
             "GB, "
             "mem usage=40.00 GB.".format(d, POST),
             "[{}] Load weight begin. avail mem={:.2f} GB".format(d, POST),
             "[{}] Load weight end. elapsed=1.00 s, type=LlamaForCausalLMEagle3, quant=None, avail mem={:.2f} GB, "
             "mem usage=1.00 GB.".format(d, post_draft),
             "[{}] KV Cache is allocated. dtype: torch.bfloat16, #tokens: {}, KV size: {} GB".format(d, t_exp,
                                                                                                     _gb(kv_target)),
             "[{}] KV Cache is allocated. dtype: torch.bfloat16, #tokens: {}, K size: {} GB, V size: {} GB".format(
                 d, t_exp, _gb(kv_draft / 2), _gb(kv_draft / 2)),
             "[{}] Memory pool end. avail mem=5.00 GB".format(d),
             "[{}] max_total_num_tokens={}, chunked_prefill_size=8192, max_prefill_tokens=16384, "
             "max_running_requests=2048, context_len=262144, available_gpu_mem=4.00 GB".format(d, t_exp)]
    # Without --model-config the 61 target layers follow from the MLA line: KV size / ((512 + 64) × 2 B ×
    # (#tokens + 1)) (MLATokenToKVPool.__init__, memory_pool.py 0.5.14).
    extra = ("--model-config", _config(tmp_path, KIMI_MLA)) if with_config else ()
    t = _analyze(tmp_path, lines, *extra)
    b = _agrees(t, t_exp)
    assert b["bytes_per_token"] == 71424 and b["draft_in_budget"] is True
    assert any("/ 61 target layers" in s for s in b["steps"]), b["steps"]


def test_0_5_16_post_capture_resize_leaves_the_reserve_free(tmp_path):
    """0.5.16+ (SGLANG_ENABLE_POST_CAPTURE_KV_SIZING, not MLA): the pre-capture 'VA upper bound' count is
    the usual formula; after capture the pool is re-sized from the memory then free so that
    pre × (1 − f) stays free (kv_pool_runtime.py compute_post_capture_kv_resize)."""
    t_pre = _profiled(MHA_CELL)
    reserve = PRE * (1 - MFS)  # 9.60 GiB
    t_final = 200000
    d = "2026-08-21 10:00:00"
    args = "ServerArgs(model_path='/m', mem_fraction_static={}, tp_size=1)".format(MFS)
    kv_pre, kv_final = (t_pre + 1) * MHA_CELL / 2, (t_final + 1) * MHA_CELL
    lines = _loaded(d, args) + [
        "[{}] KV Cache VA upper bound. dtype: torch.bfloat16, #tokens: {}, K size: {} GB, V size: {} GB".format(
            d, t_pre, _gb(kv_pre), _gb(kv_pre)),
        "[{}] Memory pool end. avail mem=39.00 GB".format(d),
        "[{}] Post-capture KV sizing: KV cache allocated. dtype: torch.bfloat16, #tokens: {}, KV size: {} GB, "
        "avail mem={:.2f} GB".format(d, t_final, _gb(kv_final), reserve),
        "[{}] max_total_num_tokens={}, chunked_prefill_size=8192, max_prefill_tokens=16384, "
        "max_running_requests=2048, context_len=131072, available_gpu_mem={:.2f} GB".format(d, t_final, reserve)]
    t = _analyze(tmp_path, lines)
    b = _agrees(t, t_pre)
    assert "left 9.60 GiB free, the reserve 9.60 GiB: agrees" in b["explanation"], b
    assert t["startup"]["ranks"][0]["kv_tokens"] == t_final


def test_page_size_and_the_0_5_11_padding_row(tmp_path):
    """page_size > 1: T // page × page after the cap (0.4.4+). req_to_token from 0.5.11: R + 1 rows (the
    class adds a padding row 0) × (context_len + 4) — ReqToTokenPool.__init__."""
    page, ctx, running = 64, 32768, 1024
    t_exp = _profiled(MHA_CELL) // page * page  # worked example: 249,024
    assert t_exp == 249024
    kv = (t_exp + page) * MHA_CELL / 2
    d = "2026-06-11 10:00:00"
    args = "ServerArgs(model_path='/m', mem_fraction_static={}, tp_size=1, page_size={})".format(MFS, page)
    lines = _loaded(d, args) + [
        "[{}] KV Cache is allocated. dtype: torch.bfloat16, #tokens: {}, K size: {} GB, V size: {} GB".format(
            d, t_exp, _gb(kv), _gb(kv)),
        "[{}] Memory pool end. avail mem=9.00 GB".format(d),
        "[{}] max_total_num_tokens={}, chunked_prefill_size=8192, max_prefill_tokens=16384, "
        "max_running_requests={}, context_len={}, available_gpu_mem=8.00 GB".format(d, t_exp, running, ctx)]
    t = _analyze(tmp_path, lines)
    _agrees(t, t_exp)
    assert t["startup"]["ranks"][0]["req_to_token_bytes"] == (running + 1) * (ctx + 4) * 4


V3_2 = dict(KIMI_MLA, index_head_dim=128)


@pytest.mark.parametrize("cfg, dtype, era, backend, pp, expected", [
    # NSA (DeepSeek-V3.2) fp8: 656 B/layer from 0.5.17 (calculate_mla_kv_cache_dim) + indexer 132 B/layer
    (V3_2, "fp8_e4m3", "0.5.17", None, 1, (656 + 132) * 61),
    (V3_2, "fp8_e4m3", "0.5.16", None, 1, (576 + 132) * 61),  # 0.5.4–0.5.16: 576 × elem + indexer
    (V3_2, "fp8_e4m3", "0.5.23", "trtllm", 1, (576 + 132) * 61),  # trtllm DSA keeps 576
    (V3_2, "bfloat16", "0.5.23", None, 1, (1152 + 132) * 61),  # not fp8: 576 × elem
    # FP4 MHA, Llama-8B: cell // 2 + (kv_heads × head_dim × L × 2) // 16 (0.5.5–0.5.15) ...
    (LLAMA_8B, "fp4_e2m1", "0.5.15", None, 1, 32768 + 4096),
    # ... + a shared dequant workspace kv_heads × head_dim × 2 from 0.5.16
    (LLAMA_8B, "fp4_e2m1", "0.5.16", None, 1, 32768 + 4096 + 2048),
    # mxfp8 (0.5.16+): + (kv_heads × (hd + v_hd) × L) // 32
    (LLAMA_8B, "mxfp8", "0.5.23", None, 1, 65536 + 2048),
    # PP: the stage's layers from 0.4.6.post5 (61 layers over 2 stages: the 31-layer stage binds)
    (KIMI_MLA, "bfloat16", "0.5.6", None, 2, 576 * 31 * 2),
    (KIMI_MLA, "bfloat16", "0.4.6", None, 2, 576 * 61 * 2),
])
def test_cells_per_release(cfg, dtype, era, backend, pp, expected):
    v = tuple(int(x) for x in era.split("."))
    g = geometry(cfg, kv_cache_dtype=dtype, era=Era(v, v, ()), nsa_backend=backend,
                 pp_size=pp)  # type: ignore[arg-type]
    assert g.bytes_per_token == expected, g.formula


def test_worked_examples_from_the_source():
    """sglang_source_facts §6: rest 30.4 GiB → 464,505 tokens for DeepSeek-V3 bf16, 249,036 for Llama-8B."""
    assert _profiled(MLA_CELL) == 464505
    assert _profiled(MHA_CELL) == 249036
    assert math.isclose(REST_GIB, 30.4)


def _swa_lines(d: str, draft: bool) -> tuple:
    """A 0.5.16 hybrid sliding-window startup (HybridSWAPoolConfigurator, pool_configurator.py): cell =
    F × n_full + r × S × n_swa; full = floor(rest / cell), swa = floor(full × r). SWAKVPool.__init__
    (swa_memory_pool.py, 0.5.16) logs the SWA half, then the full half, both unlabelled, then the total."""
    per_layer, n_full, n_swa, ratio = 8 * 256 * 2, 8, 40, 0.8
    cell = per_layer * n_full + ratio * per_layer * n_swa
    full = int(int(REST_GIB * (1 << 30)) // cell)
    swa = int(full * ratio)
    kv_swa, kv_full = (swa + 1) * per_layer * n_swa / 2, (full + 1) * per_layer * n_full / 2
    pool = "[{}] KV Cache is allocated. dtype: torch.bfloat16, #tokens: {}, K size: {} GB, V size: {} GB"
    algo = ", speculative_algorithm='EAGLE'" if draft else ""
    args = "ServerArgs(model_path='/m', mem_fraction_static={}, tp_size=1{})".format(MFS, algo)
    lines = _loaded(d, args)
    if draft:
        lines += ["[{}] Load weight begin. avail mem={:.2f} GB".format(d, POST),
                  "[{}] Load weight end. elapsed=1.00 s, type=LlamaForCausalLMEagle, quant=None, avail mem={:.2f} GB, "
                  "mem usage=0.00 GB.".format(d, POST)]
    lines += ["[{}] Use sliding window memory pool. full_layer_tokens={}, swa_layer_tokens={}".format(d, full, swa),
              pool.format(d, swa, _gb(kv_swa), _gb(kv_swa)), pool.format(d, full, _gb(kv_full), _gb(kv_full)),
              "[{}] SWAKVPool mem usage: {} GB, swa size: {}, full size: {}".format(d, _gb(2 * (kv_swa + kv_full)), swa,
                                                                                   full)]
    if draft:
        lines.append(pool.format(d, full, "0.10", "0.10"))
    lines += ["[{}] Memory pool end. avail mem=9.80 GB".format(d),
              "[{}] max_total_num_tokens={}, chunked_prefill_size=8192, max_prefill_tokens=16384, "
              "max_running_requests=2048, context_len=131072, available_gpu_mem=9.70 GB".format(d, full)]
    return lines, full, 2 * (kv_swa + kv_full)


@pytest.mark.parametrize("draft", [False, True])
def test_0_5_16_hybrid_swa_pool_reports_the_full_attention_pool(tmp_path, draft):
    """The KV tokens are the full-attention pool's (= max_total_num_tokens), not the SWA half's printed
    first; the KV bytes are both halves (the SWAKVPool total), also when an EAGLE draft's pool follows."""
    lines, full, total = _swa_lines("2026-07-20 10:00:00", draft)
    t = _analyze(tmp_path, lines)
    rank = t["startup"]["ranks"][0]
    assert rank["kv_tokens"] == full
    assert abs(rank["kv_bytes"] - total) <= 4 * GIB // 200
    if not draft:
        _agrees(t, full)


def test_0_4_2_kv_line_without_tokens_takes_the_count_from_the_summary(tmp_path):
    """0.4.2–0.4.3 print 'KV Cache is allocated. K size: …, V size: …' without #tokens
    (MHATokenToKVPool.__init__, memory_pool.py 0.4.2); the pool holds max_total_num_tokens + 1 rows, so the
    bytes per token come from the summary's count, and the check agrees without --model-config (text and
    JSON alike)."""
    t_exp = _profiled(MHA_CELL)
    kv = (t_exp + 1) * MHA_CELL / 2
    d = "2025-01-27 10:00:00"
    lines = ["[{}] server_args=ServerArgs(model_path='/m', mem_fraction_static={}, tp_size=1)".format(d, MFS),
             "[{} TP0] Load weight begin. avail mem={:.2f} GB".format(d, PRE),
             "[{} TP0] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem={:.2f} GB".format(
                 d, POST),
             "[{} TP0] KV Cache is allocated. K size: {} GB, V size: {} GB.".format(d, _gb(kv), _gb(kv)),
             "[{} TP0] Memory pool end. avail mem=9.50 GB".format(d),
             "[{} TP0] max_total_num_tokens={}, chunked_prefill_size=8192, max_prefill_tokens=16384, "
             "max_running_requests=4097, context_len=32768".format(d, t_exp)]
    t = _analyze(tmp_path, lines)
    b = _agrees(t, t_exp)
    assert b["bytes_per_token"] == MHA_CELL
    log = tmp_path / "startup.log"
    _, text, _ = run_cli(["analyze", str(log), "--detail", "--fail-on", "never"])
    assert "the log says {:,}: agrees".format(t_exp) in " ".join(text.split()), text  # wherever the line wraps


@pytest.mark.parametrize("with_config", [False, True])
def test_0_5_18_post_capture_backing_rounds_up_to_2_mib_granules(tmp_path, with_config):
    """0.5.18 post-capture sizing as the source does it (kv_pool_runtime.py compute_post_capture_kv_resize,
    kv_vmm_backing.py KvVmmBufferOwner._back_spans/finalize): before capture each of the 64 K/V buffers
    (32 layers) is backed one page rounded up to 2 MiB; budget = int((free − reserve) × 2^30) + those bytes,
    T = budget // cell; then each buffer is backed to (T + 1) rows rounded up to 2 MiB, and the logged
    'KV size' is that backed total. Bytes per token come from the 'VA upper bound' line (whole tensors),
    and the free memory left is the reserve less the padding row and the round-up."""
    mib, rows_bytes, n_buf = 1 << 20, 2048, 64  # one layer's K (or V) row: 8 heads × 128 × bf16

    def align(v: int) -> int:
        return -(-v // (2 * mib)) * (2 * mib)

    t_pre = _profiled(MHA_CELL)
    backed_before, graph_end = n_buf * align(rows_bytes), 37.0
    budget = int(max(0.0, graph_end - PRE * (1 - MFS)) * (1 << 30)) + backed_before
    t_final = min(budget // MHA_CELL, t_pre)
    final_backed = n_buf * align((t_final + 1) * rows_bytes)
    final_avail = graph_end - (final_backed - backed_before) / GIB
    assert final_backed - (t_final + 1) * MHA_CELL > 64 * mib  # the round-up the old check missed
    d = "2026-08-21 10:00:00"
    kv_pre = (t_pre + 1) * MHA_CELL / 2
    args = "ServerArgs(model_path='/m', mem_fraction_static={}, tp_size=1)".format(MFS)
    lines = _loaded(d, args) + [
        "[{}] KV Cache VA upper bound. dtype: torch.bfloat16, #tokens: {}, K size: {} GB, V size: {} GB".format(
            d, t_pre, _gb(kv_pre), _gb(kv_pre)),
        "[{}] Memory pool end. avail mem=39.38 GB".format(d),
        "[{}] Capture cuda graph begin. This can take up to several minutes. avail mem=39.30 GB".format(d),
        "[{}] Capture cuda graph end. Time elapsed: 9.00 s. mem usage=2.30 GB. avail mem={:.2f} GB.".format(
            d, graph_end),
        "[{}] Post-capture KV sizing: full_layer_tokens={}, swa_layer_tokens=0".format(d, t_final),
        "[{}] Post-capture KV sizing: KV cache allocated. dtype: torch.bfloat16, #tokens: {}, KV size: {} GB, "
        "avail mem={:.2f} GB".format(d, t_final, _gb(final_backed), final_avail),
        "[{}] max_total_num_tokens={}, chunked_prefill_size=8192, max_prefill_tokens=16384, "
        "max_running_requests=2048, context_len=131072, available_gpu_mem={:.2f} GB".format(d, t_final, final_avail)]
    t = _analyze(tmp_path, lines, *(("--model-config", _config(tmp_path, LLAMA_8B)) if with_config else ()))
    b = _agrees(t, t_pre)
    assert b["bytes_per_token"] == MHA_CELL, b
    assert "rounded up to 2 MiB granules: agrees" in b["explanation"], b
    # With the layer count the re-sized count itself is checked: 64 buffers × 2 MiB backed before capture.
    counted = "re-sized count {:,}: (free after capture 37.00 GiB − reserve + 128 MiB backed before capture)".format(
        t_final)
    assert (counted in b["explanation"] and b["explanation"].endswith(": agrees")) == with_config, b
    assert t["startup"]["ranks"][0]["kv_tokens"] == t_final
