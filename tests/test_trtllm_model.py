"""TensorRT-LLM's memory model on logs built from its real line shapes: the fraction's base by era, the raise it
would take, the cap that makes the fraction size nothing, and no raise from a startup short of its margin."""

from __future__ import annotations

import json

from tests.conftest import run_cli

GIB = 1 << 30

# The C++ executor under Triton (0.13-era lines: tests/fixtures/real_trtllm/cpp08, cpp06, cpp11 shapes).
TRITON = ("[TensorRT-LLM][WARNING] kv_cache_free_gpu_mem_fraction is not specified, will use default value of 0.9 "
          "or max_tokens_in_paged_kv_cache\n") + """\
[TensorRT-LLM][INFO] Loaded engine size: 8231 MiB
[TensorRT-LLM][INFO] Memory usage when calculating max tokens in paged kv cache: total: 79.14 GiB, available: 64.00 GiB
[TensorRT-LLM][INFO] Number of blocks in KV cache primary pool: 7372
[TensorRT-LLM][INFO] Number of blocks in KV cache secondary pool: 0, onboard blocks to primary memory before reuse: true
[TensorRT-LLM][INFO] Max KV cache pages per sequence: 125
[TensorRT-LLM][INFO] Number of tokens per block: 64.
[TensorRT-LLM][INFO] [MemUsageChange] Allocated 57.60 GiB for max tokens in paged KV cache (471808).
I0410 16:58:08.485849 1 model_lifecycle.cc:839] "successfully loaded 'tensorrt_llm'"
"""


def _analyze(tmp_path, text, *extra):
    log = tmp_path / "trt.log"
    log.write_text(text)
    code, out, err = run_cli(["analyze", str(log), "--json", *extra])
    assert code in (0, 1), err
    return json.loads(out)["targets"][0]


def test_the_cpp_fraction_is_a_share_of_the_memory_free_after_the_engine(tmp_path):
    t = _analyze(tmp_path, TRITON)
    codes = {f["code"]: f for f in t["findings"]}
    assert t["engine"]["era"] == "cpp-executor" and t["startup"]["complete"] is True
    assert t["verdict"]["cause_finding"] == "kv_fraction_semantics"
    assert "0.90 × the 64.00 GiB free once the engine and its buffers were loaded" in t["verdict"]["cause"]
    check = t["startup"]["kv_checks"][0]
    assert check["agrees"] is True and check["predicted_bytes"] == int(0.9 * 64 * GIB)
    # 64.00 − 57.60 = 6.40 GiB left; beyond the 2 GiB margin 4.40 GiB: F = (57.60 + 4.40) / 64 = 0.96875 → 0.96
    assert codes["unused_gpu_memory"]["severity"] == "warning"
    rec = t["recommendations"][0]
    assert (rec["flag"], rec["value"]) == ("kv_cache_free_gpu_mem_fraction", "0.96")
    assert rec["gain_bytes"] == int(0.96 * 64 * GIB) - int(57.60 * GIB + 0.5)
    assert rec["gain_tokens"] == rec["gain_bytes"] // (int(57.60 * GIB + 0.5) // 471808)


def test_a_max_tokens_cap_leaves_the_fraction_nothing_to_size(tmp_path):
    capped = TRITON.replace(
        "[TensorRT-LLM][INFO] Number of tokens per block: 64.",
        "[TensorRT-LLM][WARNING] Both freeGpuMemoryFraction (aka kv_cache_free_gpu_mem_fraction) and maxTokens (aka "
        "max_tokens_in_paged_kv_cache) are set (to 0.900000 and 471808, respectively). The smaller value will be used."
        "\n[TensorRT-LLM][INFO] Number of tokens per block: 64.")
    t = _analyze(tmp_path, capped)
    codes = [f["code"] for f in t["findings"]]
    assert "kv_capped_by_max_tokens" in codes
    assert not any(r["flag"] == "kv_cache_free_gpu_mem_fraction" for r in t["recommendations"])


def test_the_pytorch_backend_short_of_its_margin_is_watched_not_cut(tmp_path):
    """The real 1.1.0rc3 startup (fixture py01): 0.66 GiB left at the profiled peak, no pressure shown."""
    from tests.conftest import FIXTURES

    log = next((FIXTURES / "real_trtllm").glob("py01_*.log"))
    t = _analyze(tmp_path, log.read_text())
    codes = {f["code"]: f for f in t["findings"]}
    assert codes["low_headroom"]["severity"] == "info" and not t["recommendations"]
    assert t["startup"]["kv_cache_tokens"] == 86720
    assert [p["role"] for p in t["startup"]["kv_passes"]] == ["temporary", "final"]
    assert t["verdict"]["cause_finding"] == "kv_fraction_semantics"
    assert "total 119.70 GiB − peak 113.65 GiB" in t["verdict"]["cause"]


def test_an_fp8_kv_cache_only_where_the_pool_binds_and_the_config_shows_16_bits(tmp_path):
    """The real 1.1.0rc3 gpt-oss-120b startup: its window was cut to what the pool holds, and its 73,728 B per token
    are the model's 16-bit cache (36 layers × 8 KV heads × 64 × 2 × 2 B): FP8 doubles the tokens. Without the
    config the log cannot tell the dtype: nothing is proposed."""
    from tests.conftest import FIXTURES

    log = next((FIXTURES / "real_trtllm").glob("py01_*.log"))
    cfg = FIXTURES / "model_configs" / "gpt-oss-120b.json"
    code, out, err = run_cli(["analyze", str(log), "--json", "--model-config", str(cfg)])
    recs = {r["flag"]: r for r in json.loads(out)["targets"][0]["recommendations"]}
    fp8 = recs["kv_cache_config.dtype"]
    assert fp8["value"] == "fp8" and fp8["gain_tokens"] == 86720 and "window cut to 86,720 tokens" in fp8["rationale"]
    assert "max(1, 8 KV heads // TP 1) × 64 × 2 (K, V) × 36 layers × 2 B = 73,728 B" in fp8["rationale"]
    code, out, err = run_cli(["analyze", str(log), "--json"])
    assert not json.loads(out)["targets"][0]["recommendations"]
