"""Conformance: TensorRT-LLM's KV sizing, era by era.

Each test writes one startup in an era's line shapes (format strings from TensorRT-LLM's source; the real logs
of tests/fixtures/real_trtllm/ print them), computes what the release computes (the function cited beside
each rule), and checks the JSON report of ``kvforensics analyze``. Worked example: an 80 GB GPU (79.10 GiB CUDA
total), free_gpu_memory_fraction F = 0.9 (0.8999999761581421 through the C++ binding), Llama-3-8B bf16:
32 layers × 8 KV heads × 128 × 2 (K, V) × 2 B = 131,072 B per token, 64-token blocks (C++ eras), 32 (PyTorch).
"""

from __future__ import annotations

import math

from tests.conftest import GIB, run_json

F = "0.8999999761581421"
CELL = 131072
TOL = GIB // 200 + 1


def _analyze(tmp_path, lines):
    log = tmp_path / "trt.log"
    log.write_text("\n".join(lines) + "\n")
    code, doc = run_json(["analyze", str(log)])
    assert code in (0, 1), code
    return doc["targets"][0]


def _gib(x: float) -> str:
    return "{:.2f}".format(x)


def test_gptsession_tokens_and_bytes_per_token_05_to_09(tmp_path):
    """GptSession::createKvCacheManager (cpp/tensorrt_llm/runtime/gptSession.cpp, 0.5–0.9): 'Allocate N bytes' then
    'Using N tokens'; bytes = tokens × B exactly, and no line says what F was a share of: no budget check."""
    tokens = 132608
    t = _analyze(tmp_path, ["[TensorRT-LLM][INFO] Allocate {} bytes for k/v cache. ".format(tokens * CELL),
                            "[TensorRT-LLM][INFO] Using {} tokens in paged KV cache.".format(tokens)])
    st = t["startup"]
    assert t["engine"]["era"] == "cpp-session"
    assert st["kv_passes"] == [{"kv_cache_bytes": tokens * CELL, "kv_tokens": tokens, "role": "final", "lines": 1,
                                "line": 2}]
    assert st["kv_checks"] == [] and "kv_budget_check" not in [f["code"] for f in t["findings"]]


def test_cpp_executor_fraction_of_available_and_min_across_ranks(tmp_path):
    """KVCacheManager::calculateMaxNumBlocks (batch_manager/kvCacheManager.cpp, 0.10–0.19): available = free +
    the pool's free bytes, tokens = F × available ÷ B, blocks = ceil(tokens ÷ T), then an MPI allreduce MIN: each
    of the two ranks prints the same lines (no rank in them), and the pool is counted once, on 2 ranks."""
    available = 60.00
    tokens = math.ceil(int(float(F) * available * GIB) // CELL / 64) * 64
    kv = tokens * CELL / GIB
    one_rank = ["[TensorRT-LLM][INFO] Memory usage when calculating max tokens in paged kv cache: total: 79.10 GiB, "
                "available: {} GiB".format(_gib(available)),
                "[TensorRT-LLM][INFO] Number of blocks in KV cache primary pool: {}".format(tokens // 64),
                "[TensorRT-LLM][INFO] Number of tokens per block: 64.",
                "[TensorRT-LLM][INFO] [MemUsageChange] Allocated {} GiB for max tokens in paged KV cache ({})."
                .format(_gib(kv), tokens)]
    lines = ["[TensorRT-LLM][INFO] MPI size: 2, rank: 0", "[TensorRT-LLM][INFO] MPI size: 2, rank: 1",
             "[TensorRT-LLM][WARNING] kv_cache_free_gpu_mem_fraction is not specified, will use default value of "
             "0.9 or max_tokens_in_paged_kv_cache"]
    lines += [x for x in one_rank for _ in range(2)]
    t = _analyze(tmp_path, lines)
    st = t["startup"]
    assert t["engine"]["era"] == "cpp-executor" and st["rank_count"] == 2
    assert st["kv_passes"][0]["lines"] == 2 and st["kv_cache_tokens"] == tokens
    (check,) = st["kv_checks"]
    assert check["agrees"] is True and check["predicted_bytes"] == int(0.9 * available * GIB)
    assert "calculateMaxNumBlocks" in check["formula"]


def test_cpp_both_set_uses_the_smaller_and_the_fraction_then_sizes_nothing(tmp_path):
    """Same function: with maxTokens and F both set, min(F × available ÷ B, maxTokens) and a warning; the pool at
    maxTokens says the cap bound (kv_capped_by_max_tokens), and no fraction raise is proposed."""
    t = _analyze(tmp_path, [
        "[TensorRT-LLM][WARNING] Both freeGpuMemoryFraction (aka kv_cache_free_gpu_mem_fraction) and maxTokens (aka "
        "max_tokens_in_paged_kv_cache) are set (to 0.900000 and 32768, respectively). The smaller value will be used.",
        "[TensorRT-LLM][INFO] Memory usage when calculating max tokens in paged kv cache: total: 79.10 GiB, "
        "available: 60.00 GiB",
        "[TensorRT-LLM][INFO] Number of tokens per block: 64.",
        "[TensorRT-LLM][INFO] [MemUsageChange] Allocated 4.00 GiB for max tokens in paged KV cache (32768).",
        'I0410 16:58:08.485849 1 model_lifecycle.cc:839] "successfully loaded \'tensorrt_llm\'"'])
    codes = [f["code"] for f in t["findings"]]
    assert "kv_capped_by_max_tokens" in codes
    assert not any("fraction" in r["flag"] for r in t["recommendations"])


def test_pytorch_backend_profiled_peak_plus_temporary_pool(tmp_path):
    """KvCacheCreator (tensorrt_llm/_torch/pyexecutor/_util.py, 1.0–1.1): a temporary pool for the warm-up, then
    available = F × (total − peak + the temporary pool); the second 'Allocated' line is the real pool and the
    first is never the cache."""
    total, peak, tmp = 79.10, 20.00, 0.56
    budget = float(F) * (total - peak + tmp)
    tokens = math.ceil(int(round(budget, 2) * GIB // CELL) / 32) * 32
    t = _analyze(tmp_path, [
        "[TensorRT-LLM] TensorRT-LLM version: 1.1.0rc3",
        "[12/20/2025-04:20:04] [TRT-LLM] [I] Using LLM with PyTorch backend",
        "[TensorRT-LLM][INFO] [MemUsageChange] Allocated {} GiB for max tokens in paged KV cache (8224).".format(tmp),
        "[12/20/2025-04:21:51] [TRT-LLM] [I] Peak memory during memory usage profiling (torch + non-torch): {} GiB, "
        "available KV cache memory when calculating max tokens: {} GiB, fraction is set {}, kv size is {}. device "
        "total memory {} GiB, , tmp kv_mem {} GiB".format(_gib(peak), _gib(budget), F, CELL, _gib(total), _gib(tmp)),
        "[12/20/2025-04:21:51] [TRT-LLM] [I] Estimated max memory in KV cache : {} GiB".format(_gib(budget)),
        "[TensorRT-LLM][INFO] [MemUsageChange] Allocated {} GiB for max tokens in paged KV cache ({}).".format(
            _gib(tokens * CELL / GIB), tokens),
        "INFO:     Application startup complete."])
    st = t["startup"]
    assert [p["role"] for p in st["kv_passes"]] == ["temporary", "final"] and st["kv_cache_tokens"] == tokens
    (r,) = st["ranks"]
    assert abs(r["available_kv_bytes"] - budget * GIB) <= TOL and r["kv_bytes_per_token"] == CELL
    (check,) = st["kv_checks"]
    assert check["agrees"] is True and "KvCacheCreator" in check["formula"]


def test_pytorch_user_max_tokens_caps_the_budget(tmp_path):
    """configure_kv_cache_capacity (_util.py, 2026): 'max_tokens=N is provided. It limits max memory to Y GiB. New
    max_memory is set to X GiB' with X = Y: the user's cap bound the pool, the fraction sizes nothing."""
    t = _analyze(tmp_path, [
        "[05/14/2026-07:06:30] [TRT-LLM] [I] [llmapi] Using LLM with PyTorch backend",
        "[05/14/2026-07:07:10] [TRT-LLM] [I] [_torch] Peak memory during memory usage profiling (torch + non-torch): "
        "20.00 GiB, available KV cache memory when calculating max tokens: 53.75 GiB, fraction is set 0.9, kv size "
        "per token is 131072. device total memory 79.10 GiB, temporary kv cache memory during profiling 0.56 GiB",
        "[05/14/2026-07:07:10] [TRT-LLM] [I] [_torch] max_tokens=100000 is provided. It limits max memory to 12.21 "
        "GiB. New max_memory is set to 12.21 GiB",
        "[05/14/2026-07:07:10] [TRT-LLM] [I] [_torch] Estimated max memory in KV cache : 12.21 GiB",
        "[TRT-LLM] [I] [batchmgr][RANK 0] [MemUsageChange] Allocated 12.21 GiB for max tokens in paged KV cache "
        "(100000).",
        "INFO:     Application startup complete."])
    codes = [f["code"] for f in t["findings"]]
    assert t["engine"]["era"] == "pytorch" and "kv_capped_by_max_tokens" in codes
    assert not any("fraction" in r["flag"] for r in t["recommendations"])
    assert t["startup"]["kv_cache_tokens"] == 100000


def test_a_draft_pool_is_not_the_targets_cache(tmp_path):
    """Two-model speculative decoding (PR #3497, _util.py _get_kv_size_per_token): the draft model's pool follows
    the target's with the same token count in fewer bytes; the target's is the rank's KV cache."""
    t = _analyze(tmp_path, [
        "[06/09/2026-23:10:45] [TRT-LLM] [I] [_torch][RANK 0] Peak memory during memory usage profiling (torch + "
        "non-torch): 200.00 GiB, available KV cache memory when calculating max tokens: 60.00 GiB, fraction is set "
        "0.9, kv size per token is 35000. device total memory 266.00 GiB, temporary kv cache memory during profiling "
        "0.66 GiB",
        "[TRT-LLM] [I] [batchmgr][RANK 0] [MemUsageChange] Allocated 58.00 GiB for max tokens in paged KV cache "
        "(1900000).",
        "[TRT-LLM] [I] [batchmgr][RANK 0] [MemUsageChange] Allocated 2.00 GiB for max tokens in paged KV cache "
        "(1900000).",
        "INFO:     Application startup complete."])
    st = t["startup"]
    assert [p["role"] for p in st["kv_passes"]] == ["final", "draft"]
    assert st["ranks"][0]["kv_cache_bytes"] == 58 * GIB and st["kv_cache_tokens"] == 1900000


def test_autodeploys_bookkeeping_pool_is_no_cache_and_says_so(tmp_path):
    """AutoDeploy (1.2) registers a C++ manager "with head_dim=0" for page bookkeeping: 'Allocated 0.00 GiB … (N)'."""
    t = _analyze(tmp_path, [
        "[12/20/2025-03:35:50] [TRT-LLM] [I] Using LLM with AutoDeploy backend",
        "[12/20/2025-03:40:47] [TRT-LLM AUTO-DEPLOY] [RANK 0] [I] Using fake cache manager with head_dim=0 and num "
        "pages: 61848",
        "[TensorRT-LLM][INFO] [MemUsageChange] Allocated 0.00 GiB for max tokens in paged KV cache (3958272).",
        "INFO:     Application startup complete."])
    st = t["startup"]
    assert st["kv_cache_tokens"] is None and [p["role"] for p in st["kv_passes"]] == ["bookkeeping"]
    assert any(p["code"] == "log.bookkeeping_pool" for p in t["problems"])
    assert all(r["kv_cache_bytes"] is None for r in st["ranks"])


def test_the_window_cut_of_the_estimation_pool_is_expected_the_real_pools_is_not(tmp_path):
    """resource_manager.py get_max_atten_window_upper_bound (1.0+): the window is capped at what the pool holds; in
    the estimation pass the pool is tiny and the cut is undone, after the profiling result it stands."""
    cut = "[12/20/2025-04:21:{:02d}] [TRT-LLM] [W] Attention window size 131072 exceeds upper bound {} for available " \
        "blocks. Reducing to {}."
    lines = [cut.format(10, 8224, 8224),
             "[TensorRT-LLM][INFO] [MemUsageChange] Allocated 0.56 GiB for max tokens in paged KV cache (8224).",
             "[12/20/2025-04:21:51] [TRT-LLM] [I] Peak memory during memory usage profiling (torch + non-torch): "
             "113.65 GiB, available KV cache memory when calculating max tokens: 5.95 GiB, fraction is set "
             "0.8999999761581421, kv size is 73728. device total memory 119.70 GiB, , tmp kv_mem 0.56 GiB"]
    tail = ["[TensorRT-LLM][INFO] [MemUsageChange] Allocated 5.95 GiB for max tokens in paged KV cache (86720).",
            "INFO:     Application startup complete."]
    big = _analyze(tmp_path, lines + tail)
    assert "attention_window_reduced" not in [f["code"] for f in big["findings"]]
    small = _analyze(tmp_path, lines + [cut.format(51, 86720, 86720)] + tail)
    f = next(x for x in small["findings"] if x["code"] == "attention_window_reduced")
    assert f["severity"] == "warning" and "from 131,072 to 86,720" in f["title"]
