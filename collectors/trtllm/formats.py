"""TensorRT-LLM's startup-log line formats, 0.5 → 1.x: one row per shape (messages without the logger's
prefix, collectors/trtllm/log.py).

Units: TensorRT-LLM divides its memory figures by 2**30 where it prints GiB (C++ ``BufferManager::bytesToGiB``
helpers, Python ``/ (1024**3)``), and its Python "Use X GB for model weights" is the same division, so
"GB" is GiB here too. Fractions come through the C++ binding as float32 (0.9 prints ``0.8999999761581421``).
Rows are tried in order: start-anchored rows first, then rows that search the whole message (failures,
which exceptions wrap in their own text).
"""

from __future__ import annotations

import re
from typing import Any, Dict, Optional

from kvforensics.collectors.lineformat import Lazy, LineFormat, always
from kvforensics.collectors.units import GIB, MIB

# Figures printed with two decimals are known to half a hundredth of a GiB.
PRINT_TOLERANCE_BYTES = GIB // 200
# Lines that only end a startup still open. None: uvicorn's request log is every Python server's (engine
# detection counts idle lines as the engine's own), and the startup ends at its ready lines.
IDLE_NEEDLES: tuple = ()

_NUM = r"\d{1,9}(?:\.\d{1,20})?"
_INT = r"\d{1,16}"
MAX_GIB = float(1 << 20)
MAX_COUNT = 10**13
MAX_BYTES = 1 << 60


class Implausible(ValueError):
    """A figure outside the range TensorRT-LLM can print."""


def _bounded(x: float, limit: float) -> float:
    if not 0 <= x <= limit:
        raise Implausible("{!r} is out of range".format(x))
    return x


def gib(value: Optional[str]) -> Optional[int]:
    return None if value is None else int(round(_bounded(float(value), MAX_GIB) * GIB))


def mib(value: Optional[str]) -> Optional[int]:
    return None if value is None else int(round(_bounded(float(value), MAX_GIB * 1024) * MIB))


def count(text: Optional[str]) -> Optional[int]:
    return None if text is None else int(_bounded(int(text), MAX_COUNT))


def byte_count(text: Optional[str]) -> Optional[int]:
    return None if text is None else int(_bounded(int(text), MAX_BYTES))


def fraction(text: Optional[str]) -> Optional[float]:
    return None if text is None else _bounded(float(text), 1.0)


def _row(name: str, kind: str, needle: str, pattern: str, extract, *clues, anywhere: bool = False) -> LineFormat:  # type: ignore[no-untyped-def]
    return LineFormat(name=name, kind=kind, needle=needle, pattern=Lazy(pattern), extract=extract,
                      clues=tuple(clues), anywhere=anywhere)


def _find(p: Lazy, text: str) -> Optional[str]:
    m = p.search(text)
    return m.group(1) if m else None


# --- extractors ----------------------------------------------------------------------------

def _banner(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"version": m.group(1)}


def _weights_use(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"weights_bytes": gib(m.group(1))}


def _after_weights(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    key = "weights_bytes" if m.group(1) == "inside" else "outside_torch_after_weights_bytes"
    return {key: gib(m.group(2))}


def _activation(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"activation_bytes": gib(m.group(1))}


def _outside(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"non_torch_bytes": gib(m.group(1))}


_FRACTION_IS = Lazy(r"fraction is set (" + _NUM + r")")
_KV_SIZE = Lazy(r"kv size (?:per token )?is (" + _INT + r")")
_DEVICE_TOTAL = Lazy(r"device total memory (" + _NUM + r") GiB")
_TMP = Lazy(r"(?:tmp kv_mem|temporary kv cache memory during profiling) (" + _NUM + r") GiB")


def _peak(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"peak_bytes": gib(m.group(1)), "available_kv_bytes": gib(m.group(2)),
            "fraction": fraction(_find(_FRACTION_IS, msg)), "kv_bytes_per_token": count(_find(_KV_SIZE, msg)),
            "total_bytes": gib(_find(_DEVICE_TOTAL, msg)), "temporary_kv_bytes": gib(_find(_TMP, msg))}


def _estimated_tokens(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"estimated_tokens": count(m.group(1))}


def _estimated_memory(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"estimated_kv_bytes": gib(m.group(1))}


def _max_tokens_given(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"max_tokens": count(m.group(1)), "limit_bytes": gib(m.group(2) or None), "capped_bytes": gib(m.group(3))}


def _max_bytes_given(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"max_gpu_total_bytes": gib(m.group(1)), "capped_bytes": gib(m.group(2))}


def _both_set(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"fraction": fraction(m.group(1)), "max_tokens": count(m.group(2))}


def _window_cut(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"window": count(m.group(1)), "upper_bound": count(m.group(2)), "reduced_to": count(m.group(3))}


def _window_cut_cpp(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"window": None, "upper_bound": count(m.group(1)), "reduced_to": count(m.group(1))}


def _seq_len_adjusted(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"max_seq_len": count(m.group(1))}


_RT_MAXLEN = Lazy(r"\bmax_seq_len=(" + _INT + r")")
_RT_REQS = Lazy(r"\bmax_num_requests=(" + _INT + r")")
_RT_TOKENS = Lazy(r"\bmax_num_tokens=(" + _INT + r")")
_RT_BATCH = Lazy(r"\bmax_batch_size=(" + _INT + r")")


def _runtime_sizes(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"max_seq_len": count(_find(_RT_MAXLEN, msg)), "max_num_requests": count(_find(_RT_REQS, msg)),
            "max_num_tokens": count(_find(_RT_TOKENS, msg)), "max_batch_size": count(_find(_RT_BATCH, msg))}


def _torch_fraction(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"torch_fraction": fraction(m.group(1)), "torch_limit_bytes": gib(m.group(2))}


def _mem_usage(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"total_bytes": gib(m.group(1)), "available_bytes": gib(m.group(2))}


def _tokens_per_block(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"tokens_per_block": count(m.group(1))}


def _allocated(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"kv_cache_bytes": gib(m.group(1)), "kv_tokens": count(m.group(2))}


def _primary(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"primary_blocks": count(m.group(1))}


def _secondary(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"secondary_blocks": count(m.group(1))}


def _pages(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"max_blocks_per_seq": count(m.group(1))}


def _blocks_per_seq(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"max_blocks_per_seq": count(m.group(1)), "window": count(m.group(2)),
            "tokens_per_block": count(m.group(3)), "primary_blocks": count(m.group(4)),
            "secondary_blocks": count(m.group(5)), "max_seq_len": count(m.group(6))}


def _window_blocks(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"window": count(m.group(1)), "primary_blocks": count(m.group(2)), "secondary_blocks": count(m.group(3))}


def _old_tokens(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"kv_tokens": count(m.group(1)), "max_blocks_per_seq": count(m.group(2))}


def _old_both(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"kv_tokens": count(m.group(1)), "kv_cache_bytes": byte_count(m.group(2))}


def _old_bytes(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"kv_cache_bytes": byte_count(m.group(1))}


def _engine_size(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"engine_size_bytes": mib(m.group(1))}


def _context_memory(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    size = mib(m.group(1)) if m.group(2) == "MiB" else gib(m.group(1))
    return {"execution_context_bytes": size}


def _trt_context(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    """TensorRT's own count: "GPU +N" is what the context added (0 where TensorRT-LLM allocated it itself,
    the line before says how much), "now: GPU M" all TensorRT manages for the engine."""
    added = mib(m.group(1))
    return {"execution_context_bytes": added or None, "trt_managed_bytes": mib(m.group(2))}


_LIMIT_KEYS = {"maxBatchSize": "max_batch_size", "maxNumTokens": "max_num_tokens", "maxSequenceLen": "max_seq_len",
               "maxBeamWidth": "max_beam_width", "mMaxAttentionWindowSize": "max_attention_window"}


def _model_limit(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {_LIMIT_KEYS[m.group(1)]: count(m.group(2))}


def _fraction_of(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"fraction": fraction(m.group(1))}


def _mpi(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"world_size": count(m.group(1)), "mpi_rank": count(m.group(2))}


def _empty(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {}


def _backend(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"backend": m.group(1).lower()}


# --- failures ------------------------------------------------------------------------------

_MT_GIVEN = Lazy(r"maxTokensInPagedKvCache \((" + _INT + r")\)")
_MT_BEAM = Lazy(r"beam_?[wW]idth \((" + _INT + r")\)")
_MT_TPB = Lazy(r"tokensPerBlock \((" + _INT + r")\)")
_MT_BPS = Lazy(r"maxBlocksPerSeq \((" + _INT + r")\)")


def _too_few_tokens(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"cause": "max_tokens_too_small", "max_tokens": count(_find(_MT_GIVEN, msg)),
            "beam_width": count(_find(_MT_BEAM, msg)), "tokens_per_block": count(_find(_MT_TPB, msg)),
            "max_blocks_per_seq": count(_find(_MT_BPS, msg))}


def _executor_oom(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"cause": "executor_insufficient_memory"}


def _component(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"component": m.group(1).strip().rstrip(".")}


def _memory_row(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"label": m.group(1).strip(), "free_before_bytes": gib(m.group(2)), "free_after_bytes": gib(m.group(3)),
            "table_row": True}


def _total_free(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"label": m.group(1).strip().lower(), "bytes": gib(m.group(2))}


_TORCH_OOM = Lazy(r"total capacity of (" + _NUM + r") GiB of which (" + _NUM + r") (MiB|GiB) is free")


def _cuda_oom(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    """torch's message carries the device's total and what was free: "GPU 0 has a total capacity of 22.07 GiB of
    which 20.62 MiB is free"."""
    t = _TORCH_OOM.search(msg)
    if t is None:
        return {"cause": "cuda_out_of_memory"}
    free = mib(t.group(2)) if t.group(3) == "MiB" else gib(t.group(2))
    return {"cause": "cuda_out_of_memory", "total_bytes": gib(t.group(1)), "free_bytes": free}


def _exception(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"type": m.group(1), "text": m.group(2).strip()[:400]}


_PY_ONLY = always("0.17.0", None, "the PyTorch backend's memory profiling lines")

FORMATS = (
    # "TensorRT-LLM version: 1.1.0rc3"; 1.2 spells it "TensorRT LLM version: 1.2.0rc2".
    _row("banner", "banner", "LLM version: ", r"^TensorRT[- ]LLM version: (\S{1,40}?)(?=\s|Input|$)", _banner),
    _row("backend", "backend", "Using LLM with ", r"^Using LLM with (PyTorch|TensorRT|_autodeploy|AutoDeploy) backend",
         _backend),
    # --- weights and profiling (PyTorch backend)
    _row("weights_use", "weights", "for model weights", r"^Use (" + _NUM + r") GB for model weights", _weights_use),
    _row("after_weights", "after_weights", "Memory used after loading model weights",
         r"^Memory used after loading model weights \((inside|outside) torch\) in memory usage profiling: (" + _NUM
         + r") GiB", _after_weights, _PY_ONLY),
    _row("activation", "activation", "Memory dynamically allocated during inference",
         r"^Memory dynamically allocated during inference \(inside torch\) in memory usage profiling: (" + _NUM
         + r") GiB", _activation, _PY_ONLY),
    _row("outside_torch", "outside_torch", "Memory used outside torch",
         r"^Memory used outside torch \([^)]{0,80}\) in memory usage profiling: (" + _NUM + r") GiB", _outside),
    _row("peak", "peak", "Peak memory during memory usage profiling",
         r"^Peak memory during memory usage profiling \(torch \+ non-torch\): (" + _NUM + r") GiB, available KV "
         r"cache memory when calculating max tokens: (" + _NUM + r") GiB", _peak, _PY_ONLY),
    _row("max_tokens_set", "max_tokens_set", "max_tokens is set by kv_cache_config.max_tokens",
         r"^max_tokens is set by kv_cache_config\.max_tokens: (" + _INT + r")", _estimated_tokens),
    _row("dry_run", "dry_run", "for estimation dry run", r"for estimation dry run", _empty, anywhere=True),
    _row("estimated_tokens", "estimate", "Estimated max tokens in KV cache",
         r"^Estimated max tokens in KV cache ?: ?(" + _INT + r")", _estimated_tokens,
         always("0.17.0", None, "'Estimated max tokens in KV cache' (before the byte sizing of Aug 2025)")),
    _row("estimated_memory", "estimate", "Estimated max memory in KV cache",
         r"^Estimated max memory in KV cache ?: ?(" + _NUM + r") GiB", _estimated_memory,
         always("1.0.0", None, "'Estimated max memory in KV cache' (the byte sizing of Aug 2025)")),
    # A user's cap on the PyTorch budget: "max_tokens=N is provided, max_memory is set to X GiB" (1.1), "max_tokens=N
    # is provided. It limits max memory to Y GiB. New max_memory is set to X GiB" (2026); max_gpu_total_bytes likewise.
    _row("max_tokens_given", "user_cap", " is provided",
         r"^max_tokens=(" + _INT + r") is provided\. It limits max memory to (" + _NUM + r") GiB\. New "
         r"max_memory is set to (" + _NUM + r") GiB", _max_tokens_given),
    _row("max_tokens_given_11", "user_cap", " is provided",
         r"^max_tokens=(" + _INT + r") is provided(), max_memory is set to (" + _NUM + r") GiB", _max_tokens_given),
    _row("max_bytes_given", "user_cap", " is provided",
         r"^max_gpu_total_bytes=(" + _NUM + r") GiB is provided(?:, max_memory is set to|\. New max memory is) ("
         + _NUM + r") GiB", _max_bytes_given),
    _row("both_set_cpp", "both_set", "Both freeGpuMemoryFraction",
         r"^Both freeGpuMemoryFraction \(aka kv_cache_free_gpu_mem_fraction\) and maxTokens \(aka "
         r"max_tokens_in_paged_kv_cache\) are set \(to (" + _NUM + r") and (" + _INT + r"), respectively\)", _both_set),
    _row("both_set_py", "both_set", "Both free_gpu_memory_fraction and max_tokens",
         r"^Both free_gpu_memory_fraction and max_tokens are set \(to (" + _NUM + r") and (" + _INT
         + r")[ ,)]", _both_set),
    _row("window_cut", "window_cut", "exceeds upper bound",
         r"^Attention window size (" + _INT + r") exceeds upper bound (" + _INT + r") for available blocks\. "
         r"Reducing to (" + _INT + r")", _window_cut),
    # The C++ executor (0.13–0.19) cuts the window instead of failing: "maxAttentionWindow and maxSequenceLen are too
    # large for at least one sequence to fit in kvCache. they are reduced to 5185".
    _row("window_cut_cpp", "window_cut", "are too large for at least one sequence to fit in kvCache",
         r"^maxAttentionWindow and maxSequenceLen are too large for at least one sequence to fit in kvCache\. they are "
         r"reduced to (" + _INT + r")", _window_cut_cpp),
    _row("seq_len_adjusted", "seq_len_adjusted", "Adjusted max_seq_len to",
         r"^Adjusted max_seq_len to (" + _INT + r")", _seq_len_adjusted),
    _row("runtime_sizes", "runtime_sizes", "max_num_requests=",
         r"^max_seq_len=\d+, max_num_requests=\d+", _runtime_sizes),
    _row("torch_fraction", "torch_fraction", "Setting PyTorch memory fraction to",
         r"^Setting PyTorch memory fraction to (" + _NUM + r") \((" + _NUM + r") GiB\)", _torch_fraction),
    # --- the KV manager (C++; its Python twin from 1.0 prints the same words)
    _row("mem_usage", "mem_usage", "Memory usage when calculating max tokens in paged kv cache",
         r"^Memory usage when calculating max tokens in paged kv cache: total: (" + _NUM + r") GiB, available: ("
         + _NUM + r") GiB", _mem_usage),
    _row("tokens_per_block", "tokens_per_block", "Number of tokens per block:",
         r"^Number of tokens per block: (" + _INT + r")", _tokens_per_block),
    _row("allocated", "allocated", "for max tokens in paged KV cache",
         r"^(?:\[MemUsageChange\] )?Allocated (" + _NUM + r") GiB for max tokens in paged KV cache \((" + _INT + r")\)",
         _allocated),
    _row("primary_blocks", "blocks", "Number of blocks in KV cache primary pool",
         r"^Number of blocks in KV cache primary pool(?: for windowSize \d+)?: (" + _INT + r")", _primary),
    _row("secondary_blocks", "blocks", "Number of blocks in KV cache secondary pool",
         r"^Number of blocks in KV cache secondary pool(?: for windowSize \d+)?: (" + _INT + r")", _secondary),
    _row("pages_per_seq", "blocks", "Max KV cache pages per sequence:",
         r"^Max KV cache pages per sequence: (" + _INT + r")", _pages),
    _row("blocks_per_seq", "window_blocks", "Max KV cache blocks per sequence:",
         r"^Max KV cache blocks per sequence: (" + _INT + r") \[window size=(" + _INT + r")\], tokens per block=("
         + _INT + r"), primary blocks=(" + _INT + r")(?:, secondary blocks=(" + _INT + r"))?(?:, max sequence length=("
         + _INT + r"))?", _blocks_per_seq),
    _row("window_pool", "window_blocks", "[windowSize=",
         r"^\[windowSize=(" + _INT + r")\] \{\.primaryBlocks=(" + _INT + r"), \.second?a?r?yBlocks=(" + _INT + r")",
         _window_blocks),
    # GptSession / the early batch manager: "Using 10718 tokens in paged KV cache." (0.5–0.7), "Using 35584 total
    # tokens in paged KV cache, and 32 blocks per sequence" (0.8), after "Allocate 14575206400 bytes for k/v cache.";
    # Triton's 0.9-era "Max tokens in paged KV cache: 117760. Allocating 54022635520 bytes."
    _row("old_tokens", "allocated_old", "tokens in paged KV cache",
         r"^Using (" + _INT + r") (?:total )?tokens in paged KV cache(?:, and (" + _INT + r") blocks per sequence)?",
         _old_tokens, always("0.5.0", "0.9.0", "GptSession's 'Using N tokens in paged KV cache'")),
    _row("old_bytes", "allocated_old", "bytes for k/v cache",
         r"^Allocate (" + _INT + r") bytes for k/v cache", _old_bytes),
    _row("old_both", "allocated_old", "Max tokens in paged KV cache:",
         r"^Max tokens in paged KV cache: (" + _INT + r")\. Allocating (" + _INT + r") bytes", _old_both),
    # --- the TensorRT engine (C++ eras)
    _row("engine_size", "engine", "Loaded engine size:", r"^Loaded engine size: (" + _NUM + r") MiB", _engine_size),
    _row("context_memory", "engine", "for execution context memory",
         r"^(?:\[MemUsageChange\] )?Allocated (" + _NUM + r") (MiB|GiB) for execution context memory", _context_memory),
    _row("trt_context", "engine", "TensorRT-managed allocation in IExecutionContext creation",
         r"^(?:\[MemUsageChange\] )?TensorRT-managed allocation in IExecutionContext creation: CPU \+\d+, GPU \+("
         + _INT + r"), now: CPU \d+, GPU (" + _INT + r")", _trt_context),
    # The C++ executor's model limits (TrtGptModelInflightBatching), and Triton's default fraction warning.
    _row("model_limit", "model_limit", "TRTGptModel ",
         r"^TRTGptModel (maxBatchSize|maxNumTokens|maxSequenceLen|maxBeamWidth|mMaxAttentionWindowSize): \(?("
         + _INT + r")\)?(?: \* \d+)?$", _model_limit),
    _row("default_fraction", "fraction_default", "kv_cache_free_gpu_mem_fraction is not specified",
         r"^kv_cache_free_gpu_mem_fraction is not specified, will use default value of (" + _NUM + r")", _fraction_of),
    _row("mpi", "mpi", "MPI size:", r"^MPI size: (" + _INT + r"), (?:MPI local size: \d+, )?rank: (" + _INT + r")",
         _mpi),
    # --- ready (trtllm-serve's uvicorn, Triton's services)
    _row("ready_uvicorn", "ready", "Application startup complete", r"^(?:INFO: +)?Application startup complete",
         _empty),
    _row("ready_uvicorn_url", "ready", "Uvicorn running on", r"^(?:INFO: +)?Uvicorn running on", _empty),
    _row("ready_triton", "ready", "Started ", r"^\"?Started (?:HTTPService|GRPCInferenceService) at", _empty),
    # Triton's model repository: the TensorRT-LLM model itself loaded (preprocessing/postprocessing load first).
    _row("ready_triton_model", "ready", "successfully loaded '",
         r"^\"?successfully loaded '[\w.-]*(?:tensorrt_llm|trtllm)[\w.-]*'", _empty),
    # The LLM API offline (generation began: the executor was up) and Dynamo's worker.
    _row("ready_generate", "ready", "Processed requests:", r"^Processed requests:", _empty),
    _row("ready_worker", "ready", "ready to serve", r"^Engine loaded and ready to serve", _empty),
    # --- failures (anywhere: exceptions wrap them)
    _row("executor_oom", "failure", "Executor creation failed due to insufficient GPU memory",
         r"Executor creation failed due to insufficient GPU memory", _executor_oom, anywhere=True),
    _row("component", "failure_detail", "could not be created:",
         r"[Tt]he following component could not be created: ?(.{1,200})", _component, anywhere=True),
    # The executor memory monitor's table (1.0+ tensorrt_llm/_torch/pyexecutor/ ExecutorMemoryMonitor): "Total GPU
    # memory (GiB): 140.06", "Free GPU memory before component creation attempt (GiB): 108.86", then one
    # "Model: 139.55 / 110.70" row per component created before (capitalised labels, snake_case in later releases).
    _row("memory_total", "failure_detail", "GPU memory",
         r"^(Total GPU memory|Free GPU memory before component creation attempt) \(GiB\): (" + _NUM + r")$",
         _total_free),
    _row("memory_row", "failure_detail", " / ",
         r"^([A-Za-z_][\w ()/,-]{0,120}?): (" + _NUM + r") / (" + _NUM + r")$", _memory_row),
    _row("too_few_tokens", "failure", "must be large enough to process at least 1 sequence",
         r"must be large enough to process at least 1 sequence", _too_few_tokens, anywhere=True),
    _row("cuda_oom", "failure", "out of memory", r"(?i:\bCUDA out of memory|\bout of memory\b|OutOfMemoryError)",
         _cuda_oom, anywhere=True),
    _row("exception", "exception", "Error",
         r"^((?:[A-Za-z_][\w]*\.){0,6}[A-Z][\w]*(?:Error|Exception)): (.{0,2000})", _exception),
)

BY_NAME = {row.name: row for row in FORMATS}
STARTUP_FORMATS = FORMATS
