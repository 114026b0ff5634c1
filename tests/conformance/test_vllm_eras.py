"""Conformance: vLLM's KV budget arithmetic, memory-formula era by era.

Each test writes one startup in the line formats of an era (format strings read from the published
wheels, ``pip download vllm==X --no-deps``; collectors/vllm/formats.py holds the rows the parser
accepts), computes the KV budget, blocks, tokens and concurrency here with vLLM's formula for that
era (release and function cited beside it), and checks the JSON report of ``kvforensics analyze``.

Worked example (the wheel facts' §2): T = 80 GiB (cudaMemGetInfo total), u = 0.9 (→ 72 GiB),
weights W = 15, activation peak A = 2, non-torch growth N = 0.5, CUDA context C = 0.5, CUDA graph
pool / estimate G = 0.5 GiB. Llama-3-8B bf16, block_size 16: 16 tok × 32 layers × 8 KV heads × 128 ×
2 (K, V) × 2 B = 2 MiB per block (128 KiB per token); max_model_len 8192 → 512 blocks per request.
Expected budgets: V0-a 54.5 GiB / 27,904 blocks · V0-b 54.0 / 27,648 · V0-c 54.5 / 27,904 · V1-a 54.0 /
27,648 · V1-b, V1-c, V1-d 54.5 / 27,904 · V1-e 54.0 / 27,648 (55.6 / 28,467 at u 0.92) · V1-f 54.0 / 27,648.
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

import pytest

from tests.conftest import GIB, run_json

T = 80 * GIB
U = 0.9
W, A, N, C, G = (int(x * GIB) for x in (15, 2, 0.5, 0.5, 0.5))
BLOCK_SIZE, MAX_LEN = 16, 8192
BLOCK_BYTES = BLOCK_SIZE * 32 * 8 * 128 * 2 * 2  # V0 CacheEngine.get_cache_block_size / V1 AttentionSpec page
PER_REQUEST_BLOCKS = math.ceil(MAX_LEN / BLOCK_SIZE)  # full attention: ceil(max_model_len / block) pages
SWAP_BYTES = 4 * GIB  # V0 --swap-space default: CPU blocks = swap // block bytes
TOL = GIB // 200  # every figure is printed to 0.01 GiB (format_gib: round(x, 2))
REDUNDANCY = 150 << 20  # the --kv-cache-memory suggestion keeps 150 MiB spare (gpu_worker.py)
_STAMP = "INFO 05-01 10:00:{:02d} "


def _requested(u: float = U, ceil: bool = False) -> int:
    """T·u: a plain product up to 0.13.0; math.ceil from 0.14.0 (v1/worker/utils.py request_memory)."""
    return math.ceil(T * u) if ceil else int(T * u)


def _f2(n_bytes: float) -> str:
    return "{:.2f}".format(n_bytes / GIB)  # "%.2fGiB" (V0, V1 ≤ 0.13)


def _fg(n_bytes: float) -> str:
    return str(round(n_bytes / GIB, 2))  # format_gib (0.14.0+): round(x / 2**30, 2) as text


def _log(tmp_path, lines: List[str]) -> Dict:
    log = tmp_path / "startup.log"
    log.write_text("\n".join(lines) + "\n")
    code, doc = run_json(["analyze", str(log), "--fail-on", "never"])
    assert code == 0
    assert len(doc["targets"]) == 1
    t = doc["targets"][0]
    assert t["engine"]["name"] == "vllm"
    return t


def _lines(header: str, msgs: List[str], prefix: str = "") -> List[str]:
    """One physical line per message: '[prefix] INFO mm-dd hh:mm:ss <header> message'."""
    return ["{}{}{} {}".format(prefix, _STAMP.format(i), header.format(i), m) for i, m in enumerate(msgs)]


def _codes(t: Dict) -> List[str]:
    return [f["code"] for f in t["findings"]]


def _near(got: Optional[int], want: int) -> bool:
    return got is not None and abs(got - want) <= TOL


def _rank(t: Dict, i: int = 0, **want: Optional[int]) -> Dict:
    r = t["startup"]["ranks"][i]
    for name, value in want.items():
        if value is None:
            assert r[name] is None, (name, r)
        else:
            assert _near(r[name], value), (name, r[name], value)
    return r


def _conc(t: Dict, times: float) -> None:
    c = t["startup"]["max_concurrency"]
    assert c == {"tokens_per_request": MAX_LEN, "times": round(times, 2)}, c


def _budget_check_agrees(t: Dict, kv: int) -> None:
    checks = t["startup"]["kv_checks"]
    assert checks and all(c["agrees"] is True for c in checks), checks
    assert _near(checks[0]["predicted_bytes"], kv) and _near(checks[0]["logged_bytes"], kv), checks
    f = [f for f in t["findings"] if f["code"] == "kv_budget_check"]
    assert f and f[0]["severity"] == "info" and "agrees with" in f[0]["title"], f


def _per_token_check(t: Dict, block_bytes: int = BLOCK_BYTES) -> None:
    """No figure-by-figure check in the era: the analysis states KV / tokens = bytes per token instead."""
    assert t["startup"]["kv_checks"] == []
    f = [f for f in t["findings"] if f["code"] == "kv_budget_check"]
    assert len(f) == 1 and "≈ {:,} bytes per token".format(block_bytes // BLOCK_SIZE) in f[0]["title"], f


def _v0_blocks(kv: int) -> int:
    # V0 worker.py determine_num_available_blocks: int(kv // cache_block_size), the executor's min over workers
    return int(kv // BLOCK_BYTES)


# --- V0 ----------------------------------------------------------------------------------------


def test_v0_a_since_init_delta_no_gib_line(tmp_path):
    """V0-a 0.3.3–0.6.3 (0.6.3 vllm/worker/worker.py Worker.determine_num_available_blocks):
    peak = init_free − free_after_profile = W + A + N (init_free read after the context exists), KV = T·u − peak.
    The log prints no GiB figure for T·u or KV: only weights, blocks, concurrency and a graph line without GiB."""
    kv = _requested() - (W + A + N)
    blocks = _v0_blocks(kv)
    assert (kv, blocks) == (int(54.5 * GIB), 27904)  # facts §2 V0-a
    lines = _lines("model_runner.py:1{:03d}]", [
        "Loading model weights took {:.4f} GB".format(W / GIB),
        "# GPU blocks: {}, # CPU blocks: {}".format(blocks, SWAP_BYTES // BLOCK_BYTES),
        "Maximum concurrency for {} tokens per request: {:.2f}x".format(MAX_LEN, blocks * BLOCK_SIZE / MAX_LEN),
        "Capturing the model for CUDA graphs. This may lead to unexpected consequences if the model is not static. "
        "To run the model in eager mode, set 'enforce_eager=True' or use '--enforce-eager' in the CLI.",
        "CUDA graphs can take additional 1~3 GiB memory per GPU. If you are running out of memory, consider "
        "decreasing `gpu_memory_utilization` or enforcing eager mode. You can also reduce the `max_num_seqs` as "
        "needed to decrease memory usage.",
        "Graph capturing finished in 5 secs.",
    ])
    t = _log(tmp_path, lines)
    assert t["engine"]["era"] == "V0-a" and t["engine"]["cuda_graphs_in_budget"] is False
    assert t["engine"]["version_hint"] == "V0 0.6.3–0.6.3"
    s = t["startup"]
    assert (s["gpu_blocks"], s["cpu_blocks"]) == (27904, 2048)
    assert s["kv_cache_tokens"] is None and s["kv_cache_reports"] == []  # V0 prints no token count
    _conc(t, 54.5)
    _rank(t, weights_bytes=W, available_kv_bytes=None, requested_bytes=None, total_gpu_bytes=None,
          non_torch_bytes=None, activation_peak_bytes=None, cuda_graph_bytes=None)
    codes = _codes(t)
    assert "cudagraph_outside_budget" in codes  # graphs captured after the KV cache (1~3 GiB, no figure)
    assert "kv_budget_check" not in codes and "gpu_memory_utilization_semantics" not in codes


_V0_TAIL = ["Capturing cudagraphs for decoding. This may lead to unexpected consequences if the model is not static. "
            "To run the model in eager mode, set 'enforce_eager=True' or use '--enforce-eager' in the CLI. If "
            "out-of-memory error occurs during cudagraph capture, consider decreasing `gpu_memory_utilization` or "
            "switching to eager mode. You can also reduce the `max_num_seqs` as needed to decrease memory usage.",
            "Graph capturing finished in 5 secs, took {} GiB".format(_f2(G)),
            "init engine (profile, create kv cache, warmup model) took 20.00 seconds"]


def _v0_b_startup(*tail: str) -> Tuple[List[str], int, int]:
    """A 0.6.4.post1 worker's weights, profiling, blocks and concurrency lines, then ``tail``; with its KV
    bytes and GPU blocks. KV = T·u − torch_peak_alloc (weights included) − non_torch, non_torch =
    (T − free) − torch_allocated (vllm/worker/worker.py determine_num_available_blocks)."""
    initial, peak, post = W + C, W + A, W + C + N  # T − free before profiling; torch peak; T − free after
    non_torch = post - W
    kv = _requested() - peak - non_torch
    blocks = _v0_blocks(kv)
    lines = _lines("worker.py:{}]".format(232), [
        "Loading model weights took {:.4f} GB".format(W / GIB),
        "Memory profiling results: total_gpu_memory={}GiB initial_memory_usage={}GiB peak_torch_memory={}GiB "
        "memory_usage_post_profile={}GiB non_torch_memory={}GiB kv_cache_size={}GiB gpu_memory_utilization={:.2f}"
        .format(_f2(T), _f2(initial), _f2(peak), _f2(post), _f2(non_torch), _f2(kv), U),
        "# GPU blocks: {}, # CPU blocks: {}".format(blocks, SWAP_BYTES // BLOCK_BYTES),
        "Maximum concurrency for {} tokens per request: {:.2f}x".format(MAX_LEN, blocks * BLOCK_SIZE / MAX_LEN),
        *tail])
    return lines, kv, blocks


def test_v0_b_0_6_4_global_profile(tmp_path):
    """V0-b 0.6.4.post1 (vllm/worker/worker.py determine_num_available_blocks): KV = T·u − torch_peak_alloc
    (weights included) − non_torch, non_torch = (T − free) − torch_allocated, device-wide (C + N + O)."""
    initial, peak, post = W + C, W + A, W + C + N  # T − free before profiling; torch peak; T − free after
    non_torch = post - W
    # the capture warning and its end; no 'init engine' line in this excerpt
    lines, kv, blocks = _v0_b_startup(*_V0_TAIL[:2])
    assert (kv, blocks) == (54 * GIB, 27648)  # facts §2 V0-b
    t = _log(tmp_path, lines)
    assert t["engine"]["era"] == "V0-b" and t["engine"]["cuda_graphs_in_budget"] is False
    s = t["startup"]
    assert (s["gpu_blocks"], s["cpu_blocks"], s["kv_cache_tokens"]) == (27648, 2048, None)
    _conc(t, 54.0)
    # the report's activation peak for 0.6.4.x is the torch peak, weights included
    _rank(t, weights_bytes=W, total_gpu_bytes=T, requested_bytes=72 * GIB, available_kv_bytes=kv,
          non_torch_bytes=non_torch, activation_peak_bytes=peak, cuda_graph_bytes=G, initial_usage_bytes=initial,
          peak_torch_bytes=peak, post_profile_usage_bytes=post)
    _budget_check_agrees(t, kv)
    codes = _codes(t)
    assert "cudagraph_outside_budget" in codes and "gpu_memory_utilization_semantics" in codes


def _v0_c_lines(w: int, a: int, n: int, kv: int, header: str = "[worker.py:287]") -> List[str]:
    """0.8.5 shapes: the profiling message is one record with two newlines → three physical lines."""
    return _lines(header, [
        "Memory profiling takes 5.10 seconds",
        "the current vLLM instance can use total_gpu_memory ({}GiB) x gpu_memory_utilization ({:.2f}) = {}GiB".format(
            _f2(T), U, _f2(_requested())),
        "model weights take {}GiB; non_torch_memory takes {}GiB; PyTorch activation peak memory takes {}GiB; the rest "
        "of the memory reserved for KV Cache is {}GiB.".format(_f2(w), _f2(n), _f2(a), _f2(kv))])


def test_v0_c_per_instance_breakdown(tmp_path):
    """V0-c 0.6.5–0.10.2 (0.7.0+ vllm/worker/worker.py determine_num_available_blocks with MemorySnapshot /
    vllm/utils.py memory_profiling): KV = T·u − (W + A + N); C is outside (created before the baseline)."""
    kv = _requested() - (W + A + N)
    blocks = _v0_blocks(kv)
    assert (kv, blocks) == (int(54.5 * GIB), 27904)  # facts §2 V0-c
    weights = "Model loading took {:.4f} GiB and 10.500000 seconds".format(W / GIB)
    lines = (_lines("[model_runner.py:1{:03d}]", [weights])
             + _v0_c_lines(W, A, N, kv)
             + _lines("[executor_base.py:11{}]", [
                 "# cuda blocks: {}, # CPU blocks: {}".format(blocks, SWAP_BYTES // BLOCK_BYTES),
                 "Maximum concurrency for {} tokens per request: {:.2f}x".format(MAX_LEN,
                                                                                 blocks * BLOCK_SIZE / MAX_LEN)])
             + _lines("[model_runner.py:1{:03d}]", _V0_TAIL))
    t = _log(tmp_path, lines)
    assert t["engine"]["era"] == "V0-c" and t["engine"]["cuda_graphs_in_budget"] is False
    assert t["engine"]["version_hint"] == "V0 0.8.3–0.10.2"
    s = t["startup"]
    assert s["complete"] is True
    assert (s["gpu_blocks"], s["cpu_blocks"], s["kv_cache_tokens"]) == (27904, 2048, None)
    _conc(t, 54.5)
    _rank(t, weights_bytes=W, total_gpu_bytes=T, requested_bytes=72 * GIB, available_kv_bytes=kv,
          non_torch_bytes=N, activation_peak_bytes=A, cuda_graph_bytes=G)
    _budget_check_agrees(t, kv)
    codes = _codes(t)
    assert "cudagraph_outside_budget" in codes and "gpu_memory_utilization_semantics" in codes


def test_v0_c_oom_in_graph_capture_recommends_eager_mode(tmp_path):
    """V0-c: graphs are captured outside T·u (0.8.x model_runner.py capture_model), so a CUDA OOM during
    capture means the graph pool did not fit beside the budget: eager mode needs no graph memory."""
    kv = _requested() - (W + A + N)
    blocks = _v0_blocks(kv)
    oom = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 MiB. GPU 0 has a total capacity of "
           "80.00 GiB of which 448.00 KiB is free.")
    lines = (_v0_c_lines(W, A, N, kv)
             + _lines("[executor_base.py:11{}]", ["# cuda blocks: {}, # CPU blocks: 0".format(blocks)])
             + _lines("[model_runner.py:1{:03d}]", _V0_TAIL[:1]) + [oom])
    t = _log(tmp_path, lines)
    failure = t["startup"]["failure"]
    assert (failure["cause"], failure["stage"]) == ("cuda_out_of_memory", "graph_capture")
    recs = [(r["flag"], r["value"]) for r in t["recommendations"]]
    assert ("--enforce-eager", "") in recs
    assert "unused_gpu_memory" not in _codes(t)  # a failed startup leaves nothing "unused"


def test_v0_tp2_the_smaller_worker_binds(tmp_path):
    """V0-c at TP=2: each worker profiles and prints its own breakdown; the executor takes the minimum
    (executor_base.py determine_num_available_blocks: min over workers) and prints one blocks line.
    Llama-3-8B at TP=2: 4 KV heads per rank → 1 MiB blocks; the weights are split."""
    block = BLOCK_BYTES // 2
    w = W // 2
    kv0 = _requested() - (w + A + N)  # 62.0 GiB
    kv1 = _requested() - (w + A + 2 * N)  # 61.5 GiB: more non-torch memory on the second worker
    blocks = min(kv0, kv1) // block
    assert blocks == 62976
    weights = "Model loading took {:.4f} GiB and 10.500000 seconds".format(w / GIB)
    lines = (_lines("[model_runner.py:1{:03d}]", [weights])
             + _lines("[model_runner.py:1{:03d}]", ["Model loading took {:.4f} GiB and 10.600000 seconds".format(
                 w / GIB)], prefix="(VllmWorkerProcess pid=13105) ")
             + _v0_c_lines(w, A, N, kv0)
             + [("(VllmWorkerProcess pid=13105) " + x) for x in _v0_c_lines(w, A, 2 * N, kv1)]
             + _lines("[executor_base.py:11{}]", [
                 "# cuda blocks: {}, # CPU blocks: {}".format(blocks, SWAP_BYTES // block),
                 "Maximum concurrency for {} tokens per request: {:.2f}x".format(MAX_LEN,
                                                                                 blocks * BLOCK_SIZE / MAX_LEN)])
             + _lines("[model_runner.py:1{:03d}]", _V0_TAIL))
    t = _log(tmp_path, lines)
    assert t["engine"]["era"] == "V0-c"
    s = t["startup"]
    assert [r["rank"] for r in s["ranks"]] == ["", "VllmWorkerProcess pid=13105"]
    _rank(t, 0, available_kv_bytes=kv0, weights_bytes=w, non_torch_bytes=N)
    _rank(t, 1, available_kv_bytes=kv1, weights_bytes=w, non_torch_bytes=2 * N)
    assert (s["gpu_blocks"], s["kv_cache_tokens"]) == (blocks, None)  # min(KV) // block; V0 prints no tokens
    _conc(t, blocks * BLOCK_SIZE / MAX_LEN)  # 123.00x from the binding worker
    assert len(s["kv_checks"]) == 2 and all(c["agrees"] for c in s["kv_checks"])


# --- V1 ----------------------------------------------------------------------------------------

_GRAPH_END = "Graph capturing finished in 5 secs, took {} GiB".format(_f2(G))
_INIT_DONE = "init engine (profile, create kv cache, warmup model) took 30.00 seconds"  # ≤ 0.19.x
# 0.20.0+ (v1/engine/core.py EngineCore.__init__): '… took %.2f s (compilation: %.2f s)'
_INIT_DONE_020 = "init engine (profile, create kv cache, warmup model) took 30.00 s (compilation: 10.00 s)"


def _advisory_line(u: float) -> str:
    """0.21+ gpu_worker.py: the advisory that CUDA graphs are profiled inside the budget."""
    return ("CUDA graph memory profiling is enabled (default since v0.21.0). The current "
            "--gpu-memory-utilization={:.4f} "
            "is equivalent to --gpu-memory-utilization={:.4f} without CUDA graph memory profiling. To maintain the "
            "same effective KV cache size as before, increase --gpu-memory-utilization to {:.4f}. To disable, set "
            "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0.".format(u, round(u - G / T, 4), round(u + G / T, 4)))


def _tokens_line(tokens: int) -> str:
    return "GPU KV cache size: {:,} tokens".format(tokens)


def _conc_line(times: float) -> str:
    return "Maximum concurrency for {:,} tokens per request: {:.2f}x".format(MAX_LEN, times)


def test_v1_a_global_no_gib_line(tmp_path):
    """V1-a 0.8.0–0.9.0 (0.8.x vllm/v1/worker/gpu_worker.py Worker.determine_available_memory): KV = T·u −
    (torch_peak_alloc (W + A) + (T − free − torch_alloc) (C + N + O)). No GiB KV line at INFO; tokens =
    blocks × block_size, concurrency = tokens / max_model_len (kv_cache_utils.py, 0.8.0–0.9.0)."""
    kv = _requested() - (W + A) - (C + N)
    blocks = kv // BLOCK_BYTES
    tokens = blocks * BLOCK_SIZE
    assert (kv, blocks, tokens) == (54 * GIB, 27648, 442368)  # facts §2 V1-a
    lines = _lines("[gpu_model_runner.py:1{:03d}]", [
        "Model loading took {:.4f} GB and 10.000000 seconds".format(W / GIB),  # "GB" 0.8.0–0.8.2
    ]) + _lines("[kv_cache_utils.py:{}]", [_tokens_line(tokens), _conc_line(tokens / MAX_LEN)]) + _lines(
        "[gpu_model_runner.py:1{:03d}]", [_GRAPH_END]) + _lines("[core.py:{}]", [_INIT_DONE])
    t = _log(tmp_path, lines)
    assert t["engine"]["era"] == "V1-a" and t["engine"]["cuda_graphs_in_budget"] is False
    assert t["engine"]["version_hint"] == "V1 0.8.0–0.8.2"
    s = t["startup"]
    assert (s["kv_cache_tokens"], s["kv_cache_reports"], s["gpu_blocks"]) == (442368, [442368], None)
    _conc(t, 54.0)
    _rank(t, weights_bytes=W, cuda_graph_bytes=G, available_kv_bytes=None, requested_bytes=None,
          total_gpu_bytes=None, non_torch_bytes=None, activation_peak_bytes=None)
    codes = _codes(t)
    assert "cudagraph_outside_budget" in codes
    assert "kv_budget_check" not in codes and "gpu_memory_utilization_semantics" not in codes


def _v1_per_instance(kv: int, weights: str, available: str, extra: Sequence[str] = ()) -> List[str]:
    """Weights, Available KV, tokens, concurrency, graphs (tokens = blocks × block_size up to 0.20.0)."""
    blocks = kv // BLOCK_BYTES
    return (_lines("[gpu_model_runner.py:1{:03d}]", [weights])
            + _lines("[gpu_worker.py:2{:02d}]", ["Available KV cache memory: {} GiB".format(available)])
            + _lines("[kv_cache_utils.py:{}]", [_tokens_line(blocks * BLOCK_SIZE),
                                                _conc_line(blocks / PER_REQUEST_BLOCKS)])
            + _lines("[gpu_model_runner.py:2{:03d}]", [_GRAPH_END, *extra]) + _lines("[core.py:{}]", [_INIT_DONE]))


def _v1_common(t: Dict, kv: int, hint: str) -> None:
    blocks = kv // BLOCK_BYTES
    assert t["engine"]["version_hint"] == hint
    s = t["startup"]
    assert s["complete"] is True
    assert (s["kv_cache_tokens"], s["gpu_blocks"]) == (blocks * BLOCK_SIZE, None)  # V1 prints no block count
    _conc(t, blocks / PER_REQUEST_BLOCKS)


def test_v1_b_per_instance_before_nccl(tmp_path):
    """V1-b 0.9.1–0.10.2 (0.9.1 v1/worker/gpu_worker.py init_device / determine_available_memory):
    requested = T·u, KV = requested − (W + A + N), 'Available KV cache memory: %.2f GiB'; concurrency =
    num_blocks / ceil(per-request bytes / page bytes) from 0.9.1. The log alone (0.9.1-onward shapes) does
    not rule out later eras, so the report keeps the range and leaves era / graphs-in-budget unknown."""
    kv = _requested() - (W + A + N)
    assert (kv, kv // BLOCK_BYTES) == (int(54.5 * GIB), 27904)  # facts §2 V1-b
    t = _log(tmp_path, _v1_per_instance(kv, "Model loading took {:.4f} GiB and 10.000000 seconds".format(W / GIB),
                                        _f2(kv)))
    # 'Model loading took %.4f GiB and' (≤ 0.11.0) with 'init engine … took %.2f seconds' (≤ 0.19): V1-b or V1-c,
    # both capture graphs outside the budget
    _v1_common(t, kv, "V1 0.9.1–0.11.0")
    assert t["engine"]["era"] is None and t["engine"]["cuda_graphs_in_budget"] is False
    _rank(t, weights_bytes=W, available_kv_bytes=kv, cuda_graph_bytes=G, requested_bytes=None,
          total_gpu_bytes=None, non_torch_bytes=None, activation_peak_bytes=None)
    _per_token_check(t)
    assert "gpu_memory_utilization_semantics" in _codes(t)


def test_v1_c_snapshot_after_nccl_format_gib(tmp_path):
    """V1-c 0.11.0–0.17 (0.14.0 v1/worker/utils.py request_memory: ceil(T·u); gpu_worker.py
    determine_available_memory: KV = requested − (W + A + N)); 0.14.0+ prints with format_gib ('54.5')."""
    kv = _requested(ceil=True) - (W + A + N)
    assert (kv, kv // BLOCK_BYTES) == (int(54.5 * GIB), 27904)  # facts §2 V1-c
    t = _log(tmp_path, _v1_per_instance(kv, "Model loading took {} GiB memory and 10.000000 seconds".format(_fg(W)),
                                        _fg(kv)))
    # 'init engine … took %.2f seconds' bounds it at ≤ 0.19.1: V1-c or V1-d, graphs outside either way
    _v1_common(t, kv, "V1 0.14.0–0.19.1")
    assert t["engine"]["era"] is None and t["engine"]["cuda_graphs_in_budget"] is False
    _rank(t, weights_bytes=W, available_kv_bytes=kv, cuda_graph_bytes=G, requested_bytes=None,
          non_torch_bytes=None, activation_peak_bytes=None)
    _per_token_check(t)
    assert "cudagraph_outside_budget" in _codes(t)


def test_v1_c_engine_banner_pins_the_era(tmp_path):
    kv = _requested() - (W + A + N)
    banner = _lines("[core.py:{}]", ["Initializing a V1 LLM engine (v0.11.0) with config: model='/m', "
                                     "max_seq_len={}, kv_cache_dtype=auto".format(MAX_LEN)])
    t = _log(tmp_path, banner + _v1_per_instance(
        kv, "Model loading took {:.4f} GiB and 10.000000 seconds".format(W / GIB), _f2(kv)))
    assert t["engine"]["era"] == "V1-c"
    assert "cudagraph_outside_budget" in _codes(t)


def test_v1_d_estimate_logged_not_applied(tmp_path):
    """V1-d 0.18.0–0.19.1 (gpu_worker.py determine_available_memory + gpu_model_runner.py
    profile_cudagraph_memory): the estimate is logged, subtracted only with
    VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1 (default "0"): KV = ceil(T·u) − (W + A + N) = 54.5 GiB;
    advisory 'from u to round(u + G/T, 4)'. The dummy-KV override (512 blocks) is not the KV cache."""
    kv = _requested(ceil=True) - (W + A + N)
    assert (kv, kv // BLOCK_BYTES) == (int(54.5 * GIB), 27904)  # facts §2 V1-d
    suggested = round(U + G / T, 4)
    before = _lines("[gpu_model_runner.py:5{:03d}]", [
        "Overriding num_gpu_blocks=0 with num_gpu_blocks_override=512",
        "Estimated CUDA graph memory: {} GiB total".format(_f2(G)),
    ]) + _lines("[gpu_worker.py:3{:02d}]", [
        "In v0.19, CUDA graph memory profiling will be enabled by default "
        "(VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1), which more accurately accounts for CUDA graph memory "
        "during KV cache allocation. To try it now, set "
        "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1 and increase --gpu-memory-utilization from {:.4f} to {:.4f} to "
        "maintain the same effective KV cache size.".format(U, suggested)])
    body = _v1_per_instance(kv, "Model loading took {} GiB memory and 10.000000 seconds".format(_fg(W)), _fg(kv),
                            extra=["CUDA graph pool memory: {} GiB (actual), {} GiB (estimated), difference: 0.0 GiB "
                                   "(0.0%).".format(_fg(G), _fg(G))])
    t = _log(tmp_path, [body[0]] + before + body[1:])
    assert t["engine"]["era"] == "V1-d" and t["engine"]["cuda_graphs_in_budget"] is False
    _v1_common(t, kv, "V1 0.18.0–0.19.1")
    _rank(t, weights_bytes=W, available_kv_bytes=kv, cuda_graph_bytes=G, cuda_graph_estimate_bytes=G,
          requested_bytes=None, non_torch_bytes=None, activation_peak_bytes=None)
    assert t["startup"]["ranks"][0]["gpu_memory_utilization"] == U
    _per_token_check(t)
    codes = _codes(t)
    assert "cudagraph_outside_budget" in codes and "gpu_memory_utilization_semantics" in codes


@pytest.mark.parametrize("u, kv_gib, blocks", [(0.9, "54.0", 27648), (0.92, "55.6", 28467)])
def test_v1_e_estimate_inside_the_budget(tmp_path, u, kv_gib, blocks):
    """V1-e 0.20.0–0.26.0 (0.21.0 gpu_worker.py determine_available_memory): KV = ceil(T·u) − (W + A + N) −
    G_est (env default "1"); advisory 'equivalent to round(u − G/T, 4)'. Tokens from 0.21.0:
    int(max_concurrency × max_model_len), concurrency = blocks / 512. The 0.26.0 INFO --kv-cache-memory
    suggestion (weight / peak activation / non-torch wording, ≤ 0.26.0) pins the era."""
    requested = _requested(u, ceil=True)
    kv = requested - (W + A + N) - G
    assert kv // BLOCK_BYTES == blocks and _fg(kv) == kv_gib  # facts §2 V1-e: 54.0 / 27,648; 55.6 / 28,467
    conc = blocks / PER_REQUEST_BLOCKS
    tokens = int(conc * MAX_LEN)
    init_free = T - C
    spare = requested - (W + A + N + G) - REDUNDANCY, init_free - (W + A + N + G) - REDUNDANCY
    lines = _lines("[gpu_model_runner.py:4{:03d}]", [
        "Model loading took {} GiB memory and 10.000000 seconds".format(_fg(W)),
        "Estimated CUDA graph memory: {} GiB total".format(_f2(G)),
    ]) + _lines("[gpu_worker.py:3{:02d}]", [
        _advisory_line(u),
        "Available KV cache memory: {} GiB".format(_fg(kv)),
    ]) + _lines("[kv_cache_utils.py:{}]", [_tokens_line(tokens), _conc_line(conc)]) + _lines(
        "[gpu_model_runner.py:5{:03d}]", [
            _GRAPH_END, "CUDA graph pool memory: {} GiB (actual), {} GiB (estimated), difference: 0.0 GiB (0.0%)."
            .format(_fg(G), _fg(G))]) + _lines("[gpu_worker.py:4{:02d}]", [
                "Free memory on device ({}/{} GiB) on startup. Desired GPU memory utilization is ({}, {} GiB). Actual "
                "usage is {} GiB for weight, {} GiB for peak activation, {} GiB for non-torch memory, and {} GiB for "
                "CUDAGraph memory. Replace gpu_memory_utilization config with `--kv-cache-memory={}` ({} GiB) to fit "
                "into requested memory, or `--kv-cache-memory={}` ({} GiB) to fully utilize gpu memory. Current kv "
                "cache memory in use is {} GiB.".format(
                    _fg(init_free), _fg(T), u, _fg(requested), _fg(W), _fg(A), _fg(N), _fg(G), spare[0], _fg(spare[0]),
                    spare[1], _fg(spare[1]), _fg(kv))]) + _lines("[core.py:{}]", [_INIT_DONE_020])
    t = _log(tmp_path, lines)
    assert t["engine"]["era"] == "V1-e" and t["engine"]["cuda_graphs_in_budget"] is True
    assert t["engine"]["version_hint"] == "V1 0.20.0–0.26.0"
    s = t["startup"]
    assert (s["kv_cache_tokens"], s["gpu_blocks"]) == (tokens, None)
    _conc(t, conc)
    _rank(t, weights_bytes=W, available_kv_bytes=kv, requested_bytes=requested, total_gpu_bytes=T,
          non_torch_bytes=N, activation_peak_bytes=A, cuda_graph_bytes=G, cuda_graph_estimate_bytes=G,
          free_at_start_bytes=init_free)
    codes = _codes(t)
    assert "cudagraph_outside_budget" not in codes and "gpu_memory_utilization_semantics" in codes


def test_v1_f_free_delta_suggestion_check(tmp_path):
    """V1-f 0.27.0+ (vllm/utils/mem_utils.py memory_profiling: consumed = init_free − free_after_profile,
    transient = torch_peak − torch_allocated; gpu_worker.py determine_available_memory: KV = ceil(T·u) −
    consumed − transient − G_est; printed peak activation = transient + G_est). 0.28.0+ merged tokens line."""
    requested = _requested(ceil=True)
    consumed, transient = W + N, A
    kv = requested - consumed - transient - G
    blocks = kv // BLOCK_BYTES
    assert (kv, blocks) == (54 * GIB, 27648)  # facts §2 V1-f
    conc = blocks / PER_REQUEST_BLOCKS
    tokens = int(conc * MAX_LEN)
    peak_printed = transient + G
    init_free = T - C
    to_req = requested - consumed - peak_printed - G - REDUNDANCY  # the suggestion subtracts the graph twice
    to_gpu = init_free - consumed - peak_printed - G - REDUNDANCY
    assert _fg(to_req) == "53.35"  # facts §2 V1-f: below the 54.0 in use (surprise 5)
    lines = _lines("[gpu_model_runner.py:4{:03d}]", [
        "Model loading took {} GiB memory and 10.000000 seconds".format(_fg(W)),
        "Estimated CUDA graph memory: {} GiB total".format(_f2(G)),
    ]) + _lines("[gpu_worker.py:7{:02d}]", [
        _advisory_line(U),
        "Available KV cache memory: {} GiB".format(_fg(kv)),
        "Free memory on device ({}/{} GiB) on startup. Desired GPU memory utilization is ({}, {} GiB). Actual usage "
        "is {} GiB for consumed memory (weights + non-torch), {} GiB for peak activation, and {} GiB for CUDAGraph "
        "memory. Replace gpu_memory_utilization config with `--kv-cache-memory={}` ({} GiB) to fit into requested "
        "memory, or `--kv-cache-memory={}` ({} GiB) to fully utilize gpu memory. Current kv cache memory in use is "
        "{} GiB.".format(_fg(init_free), _fg(T), U, _fg(requested), _fg(consumed), _fg(peak_printed), _fg(G), to_req,
                         _fg(to_req), to_gpu, _fg(to_gpu), _fg(kv)),
    ]) + _lines("[kv_cache_utils.py:{}]", [_tokens_line(tokens) + ", " + _conc_line(conc)]) + _lines(
        "[gpu_model_runner.py:5{:03d}]", [_GRAPH_END]) + _lines("[core.py:{}]", [_INIT_DONE_020])
    t = _log(tmp_path, lines)
    assert t["engine"]["era"] == "V1-f" and t["engine"]["cuda_graphs_in_budget"] is True
    assert t["engine"]["version_hint"] == "V1 0.28.0–newest"
    s = t["startup"]
    assert (s["kv_cache_tokens"], s["gpu_blocks"]) == (442368, None)
    _conc(t, 54.0)
    # consumed (weights + non-torch) has no split in this wording: non-torch stays unknown
    _rank(t, weights_bytes=W, available_kv_bytes=kv, requested_bytes=requested, total_gpu_bytes=T,
          activation_peak_bytes=peak_printed, cuda_graph_bytes=G, cuda_graph_estimate_bytes=G, non_torch_bytes=None,
          free_at_start_bytes=init_free)
    _budget_check_agrees(t, kv)
    codes = _codes(t)
    assert "cudagraph_outside_budget" not in codes and "gpu_memory_utilization_semantics" in codes


def test_v1_tp2_the_smaller_worker_binds(tmp_path):
    """V1 at TP=2 (0.10.2 shapes): each worker prints its Available KV; the engine core sizes a config per
    worker (kv_cache_utils.py get_kv_cache_config, one tokens/concurrency pair each) and then sets every rank
    to the minimum number of blocks (unify_kv_cache_configs / get_kv_cache_configs)."""
    block = BLOCK_BYTES // 2  # 4 KV heads per rank
    w = W // 2
    kv0 = _requested() - (w + A + 2 * N)  # 61.5 GiB on TP0: this worker binds
    kv1 = _requested() - (w + A + N)  # 62.0 GiB
    b0, b1 = kv0 // block, kv1 // block
    core = "(EngineCore_0 pid=400) "
    lines = []
    for i in range(2):
        lines += _lines("[gpu_model_runner.py:1{:03d}]", ["Model loading took {:.4f} GiB and 10.000000 seconds".format(
            w / GIB)], prefix="(Worker_TP{} pid=40{}) ".format(i, i + 1))
    for i, kv in enumerate((kv0, kv1)):
        lines += _lines("[gpu_worker.py:2{:02d}]", ["Available KV cache memory: {} GiB".format(_f2(kv))],
                        prefix="(Worker_TP{} pid=40{}) ".format(i, i + 1))
    for b in (b0, b1):
        lines += _lines("[kv_cache_utils.py:{}]", [_tokens_line(b * BLOCK_SIZE), _conc_line(b / PER_REQUEST_BLOCKS)],
                        prefix=core)
    lines += _lines("[core.py:{}]", [_INIT_DONE], prefix=core)
    t = _log(tmp_path, lines)
    s = t["startup"]
    assert [r["rank"] for r in s["ranks"]] == ["Worker_TP0 pid=401", "Worker_TP1 pid=402"]
    _rank(t, 0, available_kv_bytes=kv0, weights_bytes=w)
    _rank(t, 1, available_kv_bytes=kv1, weights_bytes=w)
    assert s["kv_cache_reports"] == [b0 * BLOCK_SIZE, b1 * BLOCK_SIZE]
    assert s["kv_cache_tokens"] == min(b0, b1) * BLOCK_SIZE == 1007616
    _per_token_check(t, block)  # the binding worker's KV / the smaller report: 64 KiB per token per rank


def test_v1_tp2_concurrency_is_the_binding_workers(tmp_path):
    block = BLOCK_BYTES // 2
    kv_big, kv_small = _requested() - (W // 2 + A + N), _requested() - (W // 2 + A + 2 * N)
    core = "(EngineCore_0 pid=400) "
    lines = []
    for i, kv in enumerate((kv_big, kv_small)):
        lines += _lines("[gpu_worker.py:2{:02d}]", ["Available KV cache memory: {} GiB".format(_f2(kv))],
                        prefix="(Worker_TP{} pid=40{}) ".format(i, i + 1))
    for kv in (kv_big, kv_small):
        b = kv // block
        lines += _lines("[kv_cache_utils.py:{}]", [_tokens_line(b * BLOCK_SIZE), _conc_line(b / PER_REQUEST_BLOCKS)],
                        prefix=core)
    t = _log(tmp_path, lines + _lines("[core.py:{}]", [_INIT_DONE], prefix=core))
    assert t["startup"]["kv_cache_tokens"] == kv_small // block * BLOCK_SIZE
    _conc(t, kv_small // block / PER_REQUEST_BLOCKS)


def test_worked_examples_from_the_wheels():
    """facts §2/§4: 2 MiB blocks; 54.5 GiB → 27,904 blocks (446,464 tokens); 54.0 → 27,648 (442,368)."""
    assert BLOCK_BYTES == 2 * 1024 * 1024 and PER_REQUEST_BLOCKS == 512
    assert int(54.5 * GIB) // BLOCK_BYTES * BLOCK_SIZE == 446464
    assert 54 * GIB // BLOCK_BYTES * BLOCK_SIZE == 442368
    assert (math.ceil(T * 0.92) - (W + A + N) - G) // BLOCK_BYTES == 28467


@pytest.mark.parametrize("banner, bounds", [
    ("0.11.0", ((0, 11, 0), (0, 11, 0))),  # a release pins the era
    ("0.6.4.post1", ((0, 6, 4), (0, 6, 4))),  # a post-release is the same release line
    ("0.12.0.dev5+g8a2b3c4", (None, (0, 12, 0))),  # a main-branch build: no later than the release
    ("0.11.0rc2", (None, (0, 11, 0))),
    ("main", (None, None)),  # not a version: no bound
])
def test_the_engine_banner_bounds_the_release(banner, bounds):
    from kvforensics.agent.vllm.analysis import _banner_bounds

    assert _banner_bounds(banner, None, None) == bounds


# --- the by-design room: memory vLLM leaves unused given u -------------------------------------

MARGIN = 2 * GIB  # kvforensics' default --margin


def _unused(t: Dict) -> Dict:
    f = [f for f in t["findings"] if f["code"] == "unused_gpu_memory"]
    assert len(f) == 1, _codes(t)
    return f[0]


def _raise(t: Dict) -> str:
    recs = [r["value"] for r in t["recommendations"] if r["flag"] == "--gpu-memory-utilization"]
    assert len(recs) == 1, t["recommendations"]
    return recs[0]


def _raised_u(spare: int, u: float = U) -> str:
    """recommend.py: u + spare ÷ T rounded down to 0.01."""
    return "{:.2f}".format(math.floor((u + spare / T) * 100 + 1e-9) / 100)


def _v1_f_room_lines(init_free: int, consumed: int, kv: int, pool: int, estimate: int, mrv2: bool = False) -> List[str]:
    """One 0.27.x startup in the order gpu_worker.py runs it: determine_available_memory (KV = ceil(T·u) −
    consumed − transient − the estimate applied only when > 0), the engine core's KV lines, then
    compile_or_warm_up_model: capture_model, 'CUDA graph pool memory' only when the estimate > 0, and the
    --kv-cache-memory suggestion, whose CUDAGraph figure is the captured pool (cuda_graph_memory_bytes).
    Model Runner V2 (v1/worker/gpu/model_runner.py): 'Model loading took %s GiB and %.6f seconds' (no
    'memory' before 0.28.0), no estimate (profile_cudagraph_memory returns 0) and so no advisory."""
    requested = _requested(ceil=True)
    blocks = kv // BLOCK_BYTES
    conc = blocks / PER_REQUEST_BLOCKS
    weights = "Model loading took {} GiB {}and 10.000000 seconds".format(_fg(W), "" if mrv2 else "memory ")
    head = [weights] if mrv2 else [weights, "Estimated CUDA graph memory: {} GiB total".format(_f2(estimate))]
    worker = ([] if mrv2 else [_advisory_line(U)]) + ["Available KV cache memory: {} GiB".format(_fg(kv))]
    pool_line = [] if mrv2 else ["CUDA graph pool memory: {} GiB (actual), {} GiB (estimated), difference: {} GiB "
                                 "({:.1f}%).".format(_fg(pool), _fg(estimate), _fg(abs(pool - estimate)),
                                                     100 * abs(pool - estimate) / pool)]
    to_req = requested - consumed - A - pool - REDUNDANCY
    to_gpu = init_free - consumed - A - pool - REDUNDANCY
    suggestion = (
        "Free memory on device ({}/{} GiB) on startup. Desired GPU memory utilization is ({}, {} GiB). Actual usage "
        "is {} GiB for consumed memory (weights + non-torch), {} GiB for peak activation, and {} GiB for CUDAGraph "
        "memory. Replace gpu_memory_utilization config with `--kv-cache-memory={}` ({} GiB) to fit into requested "
        "memory, or `--kv-cache-memory={}` ({} GiB) to fully utilize gpu memory. Current kv cache memory in use is "
        "{} GiB.".format(_fg(init_free), _fg(T), U, _fg(requested), _fg(consumed), _fg(A), _fg(pool), to_req,
                         _fg(to_req), to_gpu, _fg(to_gpu), _fg(kv)))
    return _lines("[gpu_model_runner.py:4{:03d}]", head) + _lines("[gpu_worker.py:4{:02d}]", worker) + _lines(
        "[kv_cache_utils.py:{}]", [_tokens_line(int(conc * MAX_LEN)), _conc_line(conc)]) + _lines(
        "[gpu_model_runner.py:5{:03d}]", ["Graph capturing finished in 5 secs, took {} GiB".format(_f2(pool))]
        + pool_line) + _lines("[gpu_worker.py:7{:02d}]", [suggestion]) + _lines("[core.py:{}]", [_INIT_DONE_020])


@pytest.mark.parametrize("held, grew", [(int(1.5 * GIB), 0), (int(1.5 * GIB), GIB)])
def test_v1_f_room_is_free_at_startup_minus_the_budget(tmp_path, held, grew):
    """0.27.1+ prints 'Free memory on device (free/total GiB) on startup' (gpu_worker.py
    compile_or_warm_up_model): T − free is everything no budget covers (context, NCCL, what a co-tenant held
    before startup). Room = free at startup − ceil(T·u) − graphs outside the budget (here none: pool =
    estimate). A co-tenant that grows by ``grew`` during profiling is inside the budget (utils/mem_utils.py
    memory_profiling: consumed = init_free − free_after_profile), so only what it ``held`` comes off."""
    requested = _requested(ceil=True)
    init_free = T - C - held
    consumed = W + N + grew
    kv = requested - consumed - A - G
    t = _log(tmp_path, _v1_f_room_lines(init_free, consumed, kv, pool=G, estimate=G))
    assert t["engine"]["era"] == "V1-f"
    room = init_free - requested  # 6.0 GiB (the context-only figure was 8 − 0.515 = 7.49 GiB)
    spare = room - MARGIN
    f = _unused(t)
    assert _near(f["bytes"], spare) and "free at startup" in f["detail"], f
    assert _raise(t) == _raised_u(spare) == "0.95"  # context-only: 0.9 + 5.49/80 → 0.96


def test_v1_f_graph_pool_beyond_its_estimate_is_outside_the_budget(tmp_path):
    """0.20+ (gpu_worker.py determine_available_memory subtracts the estimate; compile_or_warm_up_model then
    prints 'CUDA graph pool memory: … (actual), … (estimated)'): the pool beyond the estimate is outside."""
    requested = _requested(ceil=True)
    init_free = T - C - int(1.5 * GIB)
    kv = requested - (W + N) - A - G
    t = _log(tmp_path, _v1_f_room_lines(init_free, W + N, kv, pool=2 * G, estimate=G))
    spare = init_free - requested - (2 * G - G) - MARGIN  # 3.5 GiB
    f = _unused(t)
    assert _near(f["bytes"], spare) and "beyond its estimate" in f["detail"], f
    assert _raise(t) == _raised_u(spare) == "0.94"


@pytest.mark.parametrize("release", ["0.27", "0.28"])
def test_mrv2_before_0_29_graph_pool_is_outside_the_budget(tmp_path, release):
    """Model Runner V2 (default for dense unquantized models from 0.22.0, config/vllm.py): its
    profile_cudagraph_memory returns 0 through 0.28.x (v1/worker/gpu/model_runner.py), gpu_worker.py subtracts
    the estimate only when > 0, and capture comes after the KV cache: the whole pool is outside the budget."""
    requested = _requested(ceil=True)
    init_free = T - C - int(1.5 * GIB)
    kv = requested - (W + N) - A  # no estimate applied
    lines = _v1_f_room_lines(init_free, W + N, kv, pool=G, estimate=0, mrv2=True)
    if release == "0.28":  # the MRV2 weights line gains "memory" in 0.28.0; gpu_worker.py still says which runner
        lines = _lines("[gpu_worker.py:{}]", ["Using V2 Model Runner"]) + [
            x.replace("GiB and", "GiB memory and") for x in lines]
    t = _log(tmp_path, lines)
    assert t["engine"]["era"] == "V1-f"
    spare = init_free - requested - G - MARGIN  # 3.5 GiB (graphs taken as inside: 4.0 → 0.95)
    f = _unused(t)
    assert _near(f["bytes"], spare) and "CUDA graph pool outside it" in f["detail"], f
    assert _raise(t) == _raised_u(spare) == "0.94"


def test_the_0_20_server_line_bounds_the_release(tmp_path):
    """0.20.0+ entrypoints/openai/api_server.py: logger.info("Starting vLLM server on %s", listen_address) (in
    0.27 logged before the engine starts: a release clue, not a sign the server is up)."""
    kv = _requested() - (W + A + N)
    lines = _v1_per_instance(kv, "Model loading took {} GiB memory and 10.000000 seconds".format(_fg(W)), _fg(kv))
    lines = [x.replace(_INIT_DONE, _INIT_DONE_020) for x in lines]
    t = _log(tmp_path, _lines("[api_server.py:{}]", ["Starting vLLM server on http://0.0.0.0:8000"]) + lines)
    assert t["engine"]["version_hint"] == "V1 0.20.0–newest"


def test_v0_b_room_keeps_the_context_inside_and_takes_the_graph_pool_off(tmp_path):
    """0.6.4.post1 worker.py determine_num_available_blocks: non_torch = (T − free) − torch_allocated is
    device-wide, so the CUDA context (and any co-tenant) is already inside T·u; the graph pool is captured
    after KV sizing (worker.py initialize_cache → _warm_up_model), outside. Room = T − T·u − the pool."""
    lines = _v0_b_startup(*_V0_TAIL[:2], "Starting vLLM API server on http://0.0.0.0:8000")[0]
    t = _log(tmp_path, lines)
    assert t["engine"]["era"] == "V0-b" and t["startup"]["complete"] is True
    spare = T - _requested() - G - MARGIN  # 5.50 GiB (the context taken off again: 4.99 GiB)
    f = _unused(t)
    assert _near(f["bytes"], spare) and "inside the budget in this era" in f["detail"], f
    assert _raise(t) == _raised_u(spare) == "0.96"


def _tp2_v1_c(extra_args: str = "") -> List[str]:
    """0.11.0 shapes at TP=2 (banner pins V1-c): no line prints T, u or free memory at INFO."""
    core = "(EngineCore_DP0 pid=400) "
    kv = _requested() - (W // 2 + A + N)
    lines = _lines("[core.py:{}]", ["Initializing a V1 LLM engine (v0.11.0) with config: model='/m', max_seq_len={}, "
                                    "tensor_parallel_size=2, kv_cache_dtype=auto".format(MAX_LEN)], prefix=core)
    for i in range(2):
        prefix = "(Worker_TP{} pid=40{}) ".format(i, i + 1)
        lines += _lines("[gpu_model_runner.py:1{:03d}]", ["Model loading took {:.4f} GiB and 10.000000 seconds".format(
            W / 2 / GIB)], prefix=prefix)
        lines += _lines("[gpu_worker.py:2{:02d}]", ["Available KV cache memory: {} GiB".format(_f2(kv))], prefix=prefix)
        lines += _lines("[gpu_model_runner.py:3{:03d}]", [_GRAPH_END], prefix=prefix)
    return lines + _lines("[core.py:{}]", [_INIT_DONE], prefix=core)


def test_v1_c_tp2_room_without_nccl_figures_is_an_upper_bound():
    """0.11.0+ gpu_worker.py init_device takes the memory snapshot after NCCL init (init_worker_distributed_
    environment): NCCL and custom all-reduce buffers are outside the budget, and no INFO line prints them, so
    a TP>1 ceiling of T·u + the context (+ graphs outside: 0.11 captures after the KV cache) is a lower bound
    on the process and the room an upper bound, said in its 'how'."""
    from kvforensics.agent.model.records import Options
    from kvforensics.agent.vllm.analysis import CUDA_CONTEXT_BYTES, build_analysis
    from kvforensics.collectors.vllm.startups import segment_lines

    lines = _tp2_v1_c()
    a = build_analysis(segment_lines([(i + 1, 0, x) for i, x in enumerate(lines)])[0], "t", Options())
    assert a.era.name == "V1-c" and len(a.ranks) == 2
    ceiling, how, others_inside = a.process_ceiling(T, {"gpu_memory_utilization": U})
    assert (ceiling, others_inside) == (int(T * U) + CUDA_CONTEXT_BYTES + G, False)
    assert "an upper bound" in how and "CUDA graph pool outside the budget" in how


def test_v0_b_comma_separated_profile_of_0_6_5_dev_builds(tmp_path):
    """vLLM main 2024-11-20 (#10460) to the 0.6.5 release, worker.py determine_num_available_blocks:
    'Memory profiling results: duration=%.2f seconds, total_gpu_memory=%.2fGiB, initial_memory_usage=%.2fGiB,
    peak_torch_memory=%.2fGiB, memory_usage_post_profile=%.2fGiB, non_torch_memory=%.2fGiB,
    kv_cache_size=%.2fGiB, gpu_memory_utilization=%.2f.' with 0.6.4.x's global arithmetic."""
    initial, peak, post = W + C, W + A, W + C + N
    non_torch = post - W
    kv = _requested() - peak - non_torch
    blocks = _v0_blocks(kv)
    t = _log(tmp_path, _lines("worker.py:{}]".format(250), [
        "Loading model weights took {:.4f} GB".format(W / GIB),
        "Memory profiling results: duration=3.21 seconds, total_gpu_memory={}GiB, initial_memory_usage={}GiB, "
        "peak_torch_memory={}GiB, memory_usage_post_profile={}GiB, non_torch_memory={}GiB, kv_cache_size={}GiB, "
        "gpu_memory_utilization={:.2f}.".format(_f2(T), _f2(initial), _f2(peak), _f2(post), _f2(non_torch),
                                                 _f2(kv), U),
        "# GPU blocks: {}, # CPU blocks: {}".format(blocks, SWAP_BYTES // BLOCK_BYTES)]))
    assert t["engine"]["era"] == "V0-b"
    _rank(t, total_gpu_bytes=T, requested_bytes=72 * GIB, available_kv_bytes=kv, non_torch_bytes=non_torch,
          initial_usage_bytes=initial, peak_torch_bytes=peak, post_profile_usage_bytes=post)
    assert t["startup"]["ranks"][0]["gpu_memory_utilization"] == U
    _budget_check_agrees(t, kv)


def test_opt_in_mrv2_of_0_12_0_13_is_not_dated_before_0_12(tmp_path):
    """The opt-in Model Runner V2 of 0.12.0/0.13.0 (VLLM_USE_V2_MODEL_RUNNER=1; v1/worker/gpu/model_runner.py
    load_model) prints 'Model loading took %.4f GiB and %.6f seconds', the very shape Model Runner V1 printed
    up to 0.11.0 (gpu_model_runner.py; 0.11.1+ adds 'memory'). From model_runner.py the line bounds the
    release at 0.13.0, not 0.11.0; 0.13.0 gpu_worker.py still prints 'Available KV cache memory: %.2f GiB'
    and core.py 'init engine … took %.2f seconds'. V1-c arithmetic (0.11.0–0.13.0: requested = T·u, a plain
    product; snapshot after NCCL), graphs outside the budget in every era the range allows."""
    kv = _requested() - (W + A + N)
    blocks = kv // BLOCK_BYTES
    weights = "Model loading took {:.4f} GiB and 10.000000 seconds".format(W / GIB)
    lines = (_lines("[model_runner.py:1{:02d}]", [weights])
             + _lines("[gpu_worker.py:3{:02d}]", ["Available KV cache memory: {} GiB".format(_f2(kv))])
             + _lines("[kv_cache_utils.py:{}]", [_tokens_line(blocks * BLOCK_SIZE),
                                                 _conc_line(blocks / PER_REQUEST_BLOCKS)])
             + _lines("[model_runner.py:3{:02d}]", [_GRAPH_END]) + _lines("[core.py:{}]", [_INIT_DONE]))
    t = _log(tmp_path, lines)
    assert t["engine"]["version_hint"] == "V1 0.9.1–0.13.0"
    assert t["engine"]["cuda_graphs_in_budget"] is False
    _rank(t, weights_bytes=W, available_kv_bytes=kv)
    # the same line from Model Runner V1's file keeps the ≤ 0.11.0 bound
    v1 = _log(tmp_path, [ln.replace("[model_runner.py:", "[gpu_model_runner.py:") for ln in lines])
    assert v1["engine"]["version_hint"] == "V1 0.9.1–0.11.0"


def _disabled_line(u: float) -> str:
    """0.20+ gpu_worker.py determine_available_memory, VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0 (0.27.0 wheel)."""
    return ("CUDA graph memory profiling is disabled (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0). Without it, CUDA "
            "graph memory is not accounted for during KV cache allocation, which may require lowering "
            "--gpu-memory-utilization to avoid OOM. Consider re-enabling it (the default as of v0.21.0) and "
            "increasing --gpu-memory-utilization from {:.4f} to {:.4f}.".format(u, round(u + G / T, 4)))


def test_v1_f_estimate_disabled_puts_the_whole_pool_outside_the_budget(tmp_path):
    """With VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0 (0.27.0 gpu_worker.py determine_available_memory: the
    estimate is computed, not subtracted, and a WARNING says so) KV = ceil(T·u) − consumed − transient, and the
    graphs captured later come on top of the budget, as before 0.20: the whole pool is outside, not only the
    part beyond the estimate ('CUDA graph pool memory' is still printed, the estimate being > 0)."""
    requested = _requested(ceil=True)
    init_free = T - C - int(1.5 * GIB)
    kv = requested - (W + N) - A  # estimate not applied
    lines = [x.replace(_advisory_line(U), _disabled_line(U))
             for x in _v1_f_room_lines(init_free, W + N, kv, pool=G, estimate=G)]
    assert any("profiling is disabled" in x for x in lines)
    t = _log(tmp_path, lines)
    assert t["engine"]["era"] == "V1-f"
    assert "cudagraph_outside_budget" in _codes(t)
    spare = init_free - requested - G - MARGIN  # 3.5 GiB, not 4.0 (pool − estimate = 0)
    f = _unused(t)
    assert _near(f["bytes"], spare) and "CUDA graph pool outside it" in f["detail"], f


@pytest.mark.parametrize("line", [
    # 0.10.2 (gpu_worker.py: raw float, '{:.2f}GiB'), 0.13.0 ('%.2f GiB'), 0.20.0+ (format_gib)
    "Initial free memory 78.9765625 GiB, reserved 20.00GiB memory for KV Cache as specified by kv_cache_memory_bytes "
    "config and skipped memory profiling. This does does not respect the gpu_memory_utilization config.",
    "Initial free memory 78.98 GiB, reserved 20.00 GiB memory for KV Cache as specified by kv_cache_memory_bytes "
    "config and skipped memory profiling. This does not respect the gpu_memory_utilization config.",
    "Initial free memory 78.98 GiB, reserved 20.0 GiB memory for KV Cache as specified by kv_cache_memory_bytes "
    "config and skipped memory profiling. This does not respect the gpu_memory_utilization config."])
def test_kv_cache_memory_bytes_sets_the_kv_and_ignores_the_fraction(tmp_path, line):
    """--kv-cache-memory(-bytes): determine_available_memory skips profiling and takes the bytes as the KV cache
    ('does not respect the gpu_memory_utilization config'), so the report takes KV and free-at-start from the
    line and makes no T·u claim; dying right after it, before any 'KV cache size' line, is dying in KV planning."""
    lines = _lines("[gpu_worker.py:4{:02d}]", [line], prefix="(EngineCore pid=7) ") + [
        "(EngineCore pid=7) ERROR 05-01 10:00:01 [core.py:1344] EngineCore failed to start."]
    t = _log(tmp_path, lines)
    _rank(t, available_kv_bytes=20 * GIB)
    assert abs(t["startup"]["ranks"][0]["free_at_start_bytes"] - 78.98 * GIB) <= TOL
    assert "gpu_memory_utilization_semantics" not in _codes(t)
    assert t["startup"]["failure"]["stage"] == "kv_cache"
