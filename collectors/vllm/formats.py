"""vLLM's startup-log line formats, 0.3.3–0.33.0: one row per shape, with the releases that print it
(format strings read from 49 release wheels; see README "vLLM").

Units: vLLM divides every memory figure by 2**30, including the old lines that say "GB"
(``Loading model weights took %.4f GB`` until 0.7.3, ``Model loading took %.4f GB`` 0.8.0–0.8.2),
so every figure here is GiB. Rows are tried in order: start-anchored rows first, then rows that
search the whole message (failures, which vLLM wraps in exception text).
"""

from __future__ import annotations

import re
from typing import Any, Dict, Optional

from kvforensics.collectors.lineformat import Lazy, LineFormat, always, first, when
from kvforensics.collectors.units import GIB

# Figures are printed with "%.2f" (or format_gib: round(x, 2)), so one is known to half a hundredth.
PRINT_TOLERANCE_BYTES = GIB // 200
# Lines that matter only to end a startup still open (the stat logger prints one every few seconds
# for as long as the server runs): the reader skips them unparsed otherwise.
IDLE_NEEDLES = ("Avg prompt throughput:",)

_NUM = r"-?\d+(?:\.\d+)?"
_INT = r"\d[\d,]*"
MAX_GIB = float(1 << 20)
MAX_COUNT = 10**13


class Implausible(ValueError):
    """A figure outside the range vLLM can print."""


def _bounded(x: float, limit: float) -> float:
    if not -limit <= x <= limit:
        raise Implausible("{!r} is out of range".format(x))
    return x


def gib(value: Optional[str]) -> Optional[int]:
    return None if value is None else int(round(_bounded(float(value), MAX_GIB) * GIB))


def count(text: Optional[str]) -> Optional[int]:
    if text is None:
        return None
    digits = text.replace(",", "")
    if len(digits) > 16:
        raise Implausible("{} digits".format(len(digits)))
    n = int(digits)
    if not 0 <= n <= MAX_COUNT:
        raise Implausible("{} is out of range".format(n))
    return n


def _fraction(text: Optional[str]) -> Optional[float]:
    return None if text is None else _bounded(float(text), 1.0)


def _row(name: str, kind: str, needle: str, pattern: str, extract, *clues, anywhere: bool = False) -> LineFormat:  # type: ignore[no-untyped-def]
    return LineFormat(name=name, kind=kind, needle=needle, pattern=Lazy(pattern), extract=extract,
                      clues=tuple(clues), anywhere=anywhere)


_FOUR_PLACES = Lazy(r"^Model loading took \d+\.\d{4} GiB and ")
_IN_SECONDS = Lazy(r"warmup model\) took \d+(?:\.\d+)? seconds")


def _runner_v1_header(d: Dict[str, Any]) -> bool:
    return str(d.get("header") or "").startswith("gpu_model_runner.py")


def _has(word: str):  # type: ignore[no-untyped-def]
    return lambda d, t: word in t


def _cause(cause: str):  # type: ignore[no-untyped-def]
    return lambda m, msg: {"cause": cause}


# --- extractors ----------------------------------------------------------------------------

def _weights(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"weights_bytes": gib(m.group("w")), "unit": m.group("unit")}


def _budget(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"total_bytes": gib(m.group("t")), "utilization": _fraction(m.group("u")),
            "requested_bytes": gib(m.group("r"))}


def _breakdown(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"profile_weights_bytes": gib(m.group("w")), "non_torch_bytes": gib(m.group("n")),
            "activation_bytes": gib(m.group("a")), "available_kv_bytes": gib(m.group("kv"))}


def _global(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"total_bytes": gib(m.group("t")), "initial_bytes": gib(m.group("init")),
            "peak_torch_bytes": gib(m.group("peak")), "post_profile_bytes": gib(m.group("post")),
            "non_torch_bytes": gib(m.group("n")), "available_kv_bytes": gib(m.group("kv")),
            "utilization": _fraction(m.group("u"))}


def _available(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"available_kv_bytes": gib(m.group(1))}


def _reserved(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"available_kv_bytes": gib(m.group("kv")), "free_bytes": gib(m.group("f")), "explicit_kv": True}


def _blocks(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"gpu_blocks": count(m.group("gpu")), "cpu_blocks": count(m.group("cpu")), "device": m.group("dev")}


_CONC = Lazy(r"Maximum concurrency for (" + _INT + r") tokens per request: (" + _NUM + r")x")


def _concurrency_of(msg: str) -> Optional[Dict[str, Any]]:
    c = _CONC.search(msg)
    if c is None:
        return None
    return {"tokens_per_request": count(c.group(1)), "times": _bounded(float(c.group(2)), 1e12)}


def _tokens(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"tokens": count(m.group("n")), "device": m.group("dev"), "concurrency": _concurrency_of(msg)}


def _concurrency(m: "re.Match[str]", msg: str) -> Optional[Dict[str, Any]]:
    return _concurrency_of(msg)


def _graph_end(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"seconds": _bounded(float(m.group("s")), 1e7), "graph_bytes": gib(m.group("g"))}  # as SGLang's elapsed


def _graph_estimate(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"estimate_bytes": gib(m.group(1))}


def _graph_pool(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"graph_bytes": gib(m.group(1)), "estimate_bytes": gib(m.group(2))}


_FROM_TO = Lazy(r"from (\d\.\d+) to (\d\.\d+)")


def _advisory_019(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    ft = _FROM_TO.search(msg)
    return {"applied": False, "utilization": _fraction(ft.group(1)) if ft else None,
            "suggested_utilization": _fraction(ft.group(2)) if ft else None}


def _advisory_on(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"applied": True, "utilization": _fraction(m.group(1)), "equivalent_utilization": _fraction(m.group(2))}


def _advisory_off(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    ft = _FROM_TO.search(msg)
    return {"applied": False, "disabled": True, "utilization": _fraction(ft.group(1)) if ft else None,
            "suggested_utilization": _fraction(ft.group(2)) if ft else None}


_CONSUMED = Lazy(r"Actual usage is (" + _NUM + r") GiB for consumed memory")
_OLD_USAGE = Lazy(r"Actual usage is (" + _NUM + r") GiB for weight, (" + _NUM + r") GiB for peak activation, ("
                        + _NUM + r") GiB for non-torch memory")
# A searched pattern that starts with a number starts only where a number does: without the
# lookbehind, every digit of a long run of digits is a start that reads to the run's end (quadratic).
_NUM_START = r"(?<![\d.])"
_PEAK = Lazy(_NUM_START + r"(" + _NUM + r") GiB for peak activation")
_CG = Lazy(_NUM_START + r"(" + _NUM + r") GiB for CUDAGraph memory")
_IN_USE = Lazy(r"Current kv cache memory in use is (" + _NUM + r") GiB")


def _find(p: Lazy, text: str) -> Optional[str]:
    m = p.search(text)
    return m.group(1) if m else None


def _suggestion(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    old = _OLD_USAGE.search(msg)
    return {"free_bytes": gib(m.group("f")), "total_bytes": gib(m.group("t")), "utilization": _fraction(m.group("u")),
            "requested_bytes": gib(m.group("r")), "consumed_bytes": gib(_find(_CONSUMED, msg)),
            "weights_bytes": gib(old.group(1)) if old else None,
            "non_torch_bytes": gib(old.group(3)) if old else None,
            "activation_bytes": gib(_find(_PEAK, msg)), "graph_bytes": gib(_find(_CG, msg)),
            "available_kv_bytes": gib(_find(_IN_USE, msg))}


def _free_short(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"cause": "insufficient_free_memory", "device": m.group("dev"), "free_bytes": gib(m.group("f")),
            "total_bytes": gib(m.group("t")), "utilization": _fraction(m.group("u")),
            "requested_bytes": gib(m.group("r"))}


def _maxlen_v0(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"cause": "max_model_len_too_large", "max_model_len": count(m.group(1)), "fits_tokens": count(m.group(2))}


def _maxlen_v1(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"cause": "max_model_len_too_large", "max_model_len": count(m.group("len")),
            "needed_bytes": gib(m.group("need")), "available_kv_bytes": gib(m.group("avail")),
            "fits_tokens": count(m.group("fits"))}


def _exception_line(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"type": m.group("type"), "text": (m.group("text") or "").strip()}


def _frame(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"path": m.group("path"), "func": m.group("func")}


_CFG_LEN = Lazy(r"\bmax_seq_len=(\d+)")
_CFG_DTYPE = Lazy(r"\bkv_cache_dtype=([\w.]+)")
_CFG_TP = Lazy(r"\btensor_parallel_size=(\d{1,4})\b")
_CFG_PP = Lazy(r"\bpipeline_parallel_size=(\d{1,4})\b")


def _engine_config(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"version": m.group("v"), "v1": bool(m.group("v1")), "max_model_len": count(_find(_CFG_LEN, msg)),
            "kv_cache_dtype": _find(_CFG_DTYPE, msg), "tensor_parallel_size": count(_find(_CFG_TP, msg)),
            "pipeline_parallel_size": count(_find(_CFG_PP, msg))}


_ARG_UTIL = Lazy(r"(?:--gpu-memory-utilization[= ]|'gpu_memory_utilization': )(\d?\.\d+|1|0)\b")
_ARG_LEN = Lazy(r"(?:--max-model-len[= ]|'max_model_len': )(\d+)")
_ARG_DTYPE = Lazy(r"(?:--kv-cache-dtype[= ]|'kv_cache_dtype': ')([\w.]+)")
_ARG_TP = Lazy(r"(?:(?:--tensor-parallel-size|-tp)[= ]|'tensor_parallel_size': )(\d{1,4})\b")
_ARG_KV_BYTES = Lazy(r"(?:--kv-cache-memory(?:-bytes)?[= ]|'kv_cache_memory_bytes': )'?([\w.]{1,24})")


def arg_values(text: str) -> Dict[str, Any]:
    """The arguments the reports read, from a ``non-default args: {…}`` dict or a command line."""
    data = {"gpu_memory_utilization": _fraction(_find(_ARG_UTIL, text)),
            "max_model_len": count(_find(_ARG_LEN, text)), "kv_cache_dtype": _find(_ARG_DTYPE, text),
            "tensor_parallel_size": count(_find(_ARG_TP, text)),
            "kv_cache_memory_bytes": _find(_ARG_KV_BYTES, text)}  # kept as printed: "50G" is valid too
    return {k: v for k, v in data.items() if v is not None}


def whole_items(text: str) -> str:
    """An args dict cut by a hard wrap (no closing ``}``) up to its last whole item: the value before
    the cut may be cut too ('max_model_len': 81|92 would read 81)."""
    if text.endswith("}"):
        return text
    at = text.rfind(", ")
    return text[:at] if at >= 0 else ""


def _args(m: "re.Match[str]", msg: str) -> Optional[Dict[str, Any]]:
    if not msg.startswith("non-default args: {") or msg.endswith("}"):
        return {"args": arg_values(msg)}
    # hard-wrapped: the dict goes on over the next lines (rows args_wrapped_*)
    return {"args": arg_values(whole_items(msg)), "open": True}


def _empty(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {}


_V0_GRAPH_BEGIN = ("0.3.3", "0.6.3", "'Capturing the model for CUDA graphs'")

FORMATS = (
    # Weights: "Loading model weights took %.4f GB" (0.4.0–0.7.3), "Model loading took %.4f GB and …"
    # (0.8.0–0.8.2), "… GiB and …" (0.8.3+), "… GiB memory and …" (0.11.1+).
    _row("weights_old", "weights", "Loading model weights took",
         r"^Loading model weights took (?P<w>" + _NUM + r") ?(?P<unit>GB|GiB)", _weights,
         always("0.4.0", "0.7.3", "'Loading model weights took … GB'")),
    _row("weights", "weights", "Model loading took",
         r"^Model loading took (?P<w>" + _NUM + r") ?(?P<unit>GB|GiB)(?P<mem> memory)? and", _weights,
         first(when(lambda d, t: d["unit"] == "GB", "0.8.0", "0.8.2", "'Model loading took … GB'"),
               when(_has("GiB memory"), "0.11.1", None, "'Model loading took … GiB memory'"),
               # Model Runner V1 prints %.4f without 'memory' up to 0.11.0 (v1/worker/gpu_model_runner.py
               # load_model); the opt-in Model Runner V2 (VLLM_USE_V2_MODEL_RUNNER=1, v1/worker/gpu/model_runner.py
               # load_model) prints the same '%.4f GiB and' in 0.12.0 and 0.13.0 and format_gib ('%s GiB and')
               # from 0.14.0 (read in the 0.12.0, 0.13.0, 0.14.0 wheels): only gpu_model_runner.py's header
               # bounds the line at 0.11.0
               when(lambda d, t: bool(_FOUR_PLACES.search(t)) and _runner_v1_header(d), "0.8.3", "0.11.0",
                    "'Model loading took %.4f GiB and' (gpu_model_runner.py)"),
               when(lambda d, t: bool(_FOUR_PLACES.search(t)), "0.8.3", "0.13.0",
                    "'Model loading took %.4f GiB and' (Model Runner V1 ≤ 0.11.0 or the opt-in V2 of 0.12–0.13)"),
               always("0.8.3", None, "'Model loading took … GiB and'"))),
    # V0 per-instance profiling message (0.6.5–0.10.2): three physical lines of one message.
    _row("profile_takes", "profile_begin", "Memory profiling takes", r"^Memory profiling takes", _empty,
         always("0.6.5", "0.10.2", "'Memory profiling takes' (V0 per-instance profiling)")),
    _row("profile_budget", "budget", "the current vLLM instance can use",
         r"^the current vLLM instance can use total_gpu_memory \((?P<t>" + _NUM + r") ?GiB\) x "
         r"gpu_memory_utilization \((?P<u>" + _NUM + r")\) = (?P<r>" + _NUM + r") ?GiB", _budget,
         always("0.6.5", "0.10.2", "'the current vLLM instance can use' (V0 per-instance)")),
    _row("profile_breakdown", "breakdown", "the rest of the memory reserved for KV Cache",
         r"^model weights take (?P<w>" + _NUM + r") ?GiB; non_torch_memory takes (?P<n>" + _NUM + r") ?GiB; "
         r"PyTorch activation peak memory takes (?P<a>" + _NUM + r") ?GiB; the rest of the memory reserved for "
         r"KV Cache is (?P<kv>" + _NUM + r") ?GiB", _breakdown,
         always("0.6.5", "0.10.2", "'model weights take …; … reserved for KV Cache is' (V0 per-instance)")),
    # 0.6.4.x worker.py: space-separated; 0.6.5 dev builds (2024-11-20 to the 0.6.5 release, #10460):
    # 'duration=%.2f seconds, ' first, comma-separated, a trailing '.', the same global arithmetic
    _row("profile_global", "global_profile", "Memory profiling results:",
         r"^Memory profiling results: (?:duration=" + _NUM + r" seconds, )?total_gpu_memory=(?P<t>" + _NUM
         + r")GiB,? initial_memory_usage=(?P<init>" + _NUM + r")GiB,? peak_torch_memory=(?P<peak>" + _NUM
         + r")GiB,? memory_usage_post_profile=(?P<post>" + _NUM + r")GiB,? non_torch_memory=(?P<n>" + _NUM
         + r")GiB,? kv_cache_size=(?P<kv>" + _NUM + r")GiB,? gpu_memory_utilization=(?P<u>" + _NUM + r")", _global,
         # a build between 0.6.4.post1 and 0.6.5: dated as 0.6.4 (its arithmetic, era V0-b)
         first(when(_has("duration="), "0.6.4", "0.6.4", "'Memory profiling results: duration=…' (0.6.5 dev builds, "
                    "global profiling as 0.6.4.x)"),
               always("0.6.4", "0.6.4", "'Memory profiling results:' (0.6.4.x global profiling)"))),
    _row("available", "available_kv", "Available KV cache memory:",
         r"^Available KV cache memory: (" + _NUM + r") ?GiB", _available,
         first(when(lambda d, t: bool(re.search(r": -?\d+\.\d\d GiB", t)), "0.9.1", None,
                    "'Available KV cache memory' (V1 0.9.1+)"),
               always("0.14.0", None, "'Available KV cache memory' printed with format_gib (0.14.0+)"))),
    # --kv-cache-memory(-bytes) set: profiling skipped, KV = the bytes given (v1/worker/gpu_worker.py
    # determine_available_memory, 0.10.2: raw float and '{:.2f}GiB', 0.11–0.13 '%.2f GiB', 0.14+ format_gib;
    # read in the 0.13.0, 0.20.0 and 0.28.0 wheels). "Initial free memory" is init_snapshot.free_memory,
    # the same figure as the suggestion's "Free memory on device (free/total) on startup".
    _row("kv_reserved", "available_kv", "memory for KV Cache as specified by kv_cache_memory_bytes",
         r"^Initial free memory (?P<f>" + _NUM + r") ?GiB, reserved (?P<kv>" + _NUM + r") ?GiB memory for KV Cache "
         r"as specified by kv_cache_memory_bytes", _reserved,
         always("0.10.2", None, "'reserved … GiB memory for KV Cache as specified by kv_cache_memory_bytes'")),
    # "# GPU blocks: %d, # CPU blocks: %d" (≤0.6.6), "# CUDA blocks" (0.7.0–0.7.2), "# cuda blocks" (0.7.3–0.10.2),
    # V1 "# GPU blocks: %d" (0.6.4.post1–0.7.3). A markdown paste may eat the "# ".
    _row("blocks", "blocks", " blocks: ",
         r"^(?:# ?)?(?P<dev>GPU|CUDA|cuda|rocm|xpu|hpu|tpu|npu) blocks: (?P<gpu>\d+)(?:, # CPU blocks: (?P<cpu>\d+))?",
         _blocks,
         first(when(lambda d, t: d["cpu_blocks"] is None, "0.6.4", "0.7.3", "V1 '# GPU blocks: N' (no CPU blocks)"),
               when(lambda d, t: d["device"] == "CUDA", "0.7.0", "0.7.2", "'# CUDA blocks:'"),
               when(lambda d, t: d["device"] == "cuda", "0.7.3", "0.10.2", "'# cuda blocks:'"),
               when(lambda d, t: d["device"] == "GPU", "0.3.3", "0.6.6", "'# GPU blocks: N, # CPU blocks: M'"))),
    _row("kv_tokens", "kv_tokens", " KV cache size: ",
         r"^(?P<dev>[\w +]+?) KV cache size: (?P<n>" + _INT + r") tokens", _tokens,
         first(when(_has("Maximum concurrency"), "0.28.0", None, "merged 'KV cache size …, Maximum concurrency' line"),
               always("0.8.0", None, "'GPU KV cache size: N tokens' (V1)"))),
    _row("concurrency", "concurrency", "Maximum concurrency for", r"^Maximum concurrency for", _concurrency,
         first(when(_has(","), "0.8.0", None, "'Maximum concurrency' with a comma-grouped length"),
               always("0.6.3", "0.10.2", "'Maximum concurrency for N tokens' (plain length)"))),
    _row("graph_begin_old", "graph_begin", "Capturing the model for CUDA graphs",
         r"^Capturing the model for CUDA graphs", _empty, always(*_V0_GRAPH_BEGIN)),
    _row("graph_begin", "graph_begin", "Capturing cudagraphs for decoding", r"^Capturing cudagraphs for decoding",
         _empty, always("0.6.4", "0.10.2", "'Capturing cudagraphs for decoding' (V0 model runner)")),
    # V1's tqdm bar while graphs are captured ("Capturing CUDA graph shapes: 0%| 0/67", later "Capturing CUDA
    # graphs (mixed prefill-decode, PIECEWISE): 0%| 0/51"): bare, with no prefix; the capture has begun.
    _row("graph_progress", "graph_begin", "Capturing CUDA graph",
         r"^Capturing CUDA graph(?:s| shapes)\b[^:]*:\s*\d{1,3}%[^|]*\|[^|]*\|\s*(?P<done>\d+)/(?P<total>\d+)",
         lambda m, msg: {"done": int(m.group("done")[:9]), "total": int(m.group("total")[:9])}),
    _row("graph_end", "graph_end", "Graph capturing finished in",
         r"^Graph capturing finished in (?P<s>\d+(?:\.\d+)?) secs?(?:, took (?P<g>" + _NUM + r") ?GiB)?", _graph_end,
         first(when(lambda d, t: d["graph_bytes"] is None, "0.3.3", "0.6.3", "'Graph capturing finished' without GiB"),
               always("0.6.4", None, "'Graph capturing finished …, took X GiB'"))),
    _row("graph_estimate", "graph_estimate", "Estimated CUDA graph memory:",
         r"^Estimated CUDA graph memory: (" + _NUM + r") ?GiB", _graph_estimate,
         always("0.18.0", None, "'Estimated CUDA graph memory'")),
    _row("graph_pool", "graph_pool", "CUDA graph pool memory:",
         r"^CUDA graph pool memory: (" + _NUM + r") ?GiB \(actual\), (" + _NUM + r") ?GiB \(estimated\)", _graph_pool,
         always("0.18.0", None, "'CUDA graph pool memory: … (actual)'")),
    _row("cg_advisory_019", "graph_advisory", "In v0.19, CUDA graph memory profiling",
         r"^In v0\.19, CUDA graph memory profiling will be enabled by default", _advisory_019,
         always("0.18.0", "0.19.1", "'In v0.19, CUDA graph memory profiling will be enabled' (estimate not applied)")),
    _row("cg_enabled", "graph_advisory", "CUDA graph memory profiling is enabled",
         r"^CUDA graph memory profiling is enabled.*?The current --gpu-memory-utilization=(\d?\.\d+) is equivalent "
         r"to --gpu-memory-utilization=(\d?\.\d+)", _advisory_on,
         always("0.20.0", None, "'CUDA graph memory profiling is enabled' (estimate inside the budget)")),
    _row("cg_disabled", "graph_advisory", "CUDA graph memory profiling is disabled",
         r"^CUDA graph memory profiling is disabled", _advisory_off,
         always("0.20.0", None, "'CUDA graph memory profiling is disabled'")),
    _row("override", "blocks_override", "num_gpu_blocks_override",
         r"^Overriding num_gpu_blocks=(\d+) with num_gpu_blocks_override=(\d+)", _empty),
    _row("init_done", "init_done", "init engine (profile, create kv cache",
         r"^init engine \(profile, create kv cache, warmup model\) took", _empty,
         # '… took %.2f seconds' up to 0.19.x; 0.20.0 prints '… took %.2f s (compilation: …' (v1/engine/core.py)
         when(lambda d, t: bool(_IN_SECONDS.search(t)), None, "0.19.1", "'init engine … took %.2f seconds'")),
    # The server is up: the API server's banner (openai/api_server.py run_server_worker logs it
    # inside `async with build_async_engine_client(...)`, i.e. after the engine, its KV cache and
    # graphs are built, just before serve_http), then the stat logger's periodic line (V0
    # metrics.py, V1 loggers.py "Engine 000: …"). Either ends a startup that printed no
    # 'init engine … took' (V1), so a log of days of serving is not called a fragment.
    _row("api_server", "serving", "Starting vLLM API server", r"^Starting vLLM API server", _empty),
    # 0.20+ (entrypoints/openai/api_server.py): logged before the engine starts in 0.27, so a release clue only,
    # not a sign the server is up
    _row("server_on", "server_on", "Starting vLLM server on", r"^Starting vLLM server on ", _empty,
         always("0.20.0", None, "'Starting vLLM server on …'")),
    # v1/worker/gpu_worker.py init_device, logger.info_once (0.27.0): the worker runs Model Runner V2
    _row("mrv2", "model_runner_v2", "Using V2 Model Runner", r"^Using V2 Model Runner", _empty),
    _row("stat_logger", "serving", "Avg prompt throughput:", r"^(?:Engine \d+: )?Avg prompt throughput:", _empty),
    _row("engine_config", "engine_config", "LLM engine (v",
         r"^Initializing an? (?:V0 |(?P<v1>V1 ))?LLM engine \(v(?P<v>[\w.+-]+)\) with config", _engine_config),
    _row("non_default_args", "args", "non-default args:", r"^non-default args: \{", _args,
         always("0.10.0", None, "'non-default args:'")),
    _row("cli", "args", "vllm serve", r"vllm serve ", _args, anywhere=True),
    # A console copy that hard-wraps long lines (real_vllm entries 42, 43: wrapped at ~138 columns)
    # puts the rest of an open 'non-default args: {' dict on lines without header or prefix; the
    # analysis joins a run of them, line after line, to the open args line (and to nothing else).
    # One needle per argument read: a bare "': " would make every dict-bearing serving line a
    # candidate (10x slower on a log of them, bench/RESULTS.md); a tail holding none of them holds no
    # argument the reports read, unless the wrap cut inside its key (then that argument stays unknown).
    *(_row("args_wrapped_" + key.split("'")[0], "args_tail", key, r"^[^{}]*'\w*': [^{}]*\}?$", _empty)
      for key in ("gpu_memory_utilization': ", "max_model_len': ", "kv_cache_dtype': ", "tensor_parallel_size': ",
                  "kv_cache_memory_bytes': ")),
    _row("kv_fp8", "kv_dtype", "data type to store kv cache", r"^Using (fp8\w*) data type to store kv cache",
         lambda m, msg: {"kv_cache_dtype": m.group(1)}),
    # 0.10.2 and 0.26+ INFO: the --kv-cache-memory suggestion ("… on startup. Desired …").
    _row("kv_suggestion", "suggestion", "on startup. Desired GPU memory utilization",
         r"^Free memory on device(?: \S+)? \((?P<f>" + _NUM + r")/(?P<t>" + _NUM + r") GiB\) on startup\. Desired GPU "
         r"memory utilization is \((?P<u>" + _NUM + r"), (?P<r>" + _NUM + r") GiB\)", _suggestion,
         first(when(_has("consumed memory"), "0.27.0", None, "'--kv-cache-memory' suggestion (consumed memory)"),
               always("0.10.2", "0.26.0", "'--kv-cache-memory' suggestion (weight, peak activation, non-torch)"))),
    # Failures (searched anywhere: they come inside ValueError/RuntimeError text).
    _row("free_short", "failure", "is less than desired GPU memory utilization",
         r"Free memory on device(?: (?P<dev>[\w:]+))? \((?P<f>" + _NUM + r")/(?P<t>" + _NUM + r") GiB\) on startup is "
         r"less than desired GPU memory utilization \((?P<u>" + _NUM + r"), (?P<r>" + _NUM + r") GiB\)", _free_short,
         first(when(lambda d, t: bool(d.get("device")), "0.14.0", None, "free-memory check naming the device"),
               always("0.9.1", "0.13.0", "free-memory check at worker init")), anywhere=True),
    _row("maxlen_v0", "failure", "is larger than the maximum number of tokens",
         r"The model's max seq len \((\d+)\) is larger than the maximum number of tokens that can be stored in KV "
         r"cache \((\d+)\)", _maxlen_v0, always("0.3.3", "0.10.2", "V0 max seq len check"), anywhere=True),
    _row("maxlen_v1", "failure", "To serve at least one request",
         r"To serve at least one request with the models?'s max seq len \((?P<len>\d+)\), \((?P<need>" + _NUM
         + r") ?Gi?B KV cache is needed, which is larger than the available KV cache memory \((?P<avail>" + _NUM
         + r") ?Gi?B\)(?:\. Based on the available memory, the estimated maximum model length is (?P<fits>\d+))?",
         _maxlen_v1,
         first(when(lambda d, t: d["fits_tokens"] is not None, "0.8.4", None, "V1 max seq len check with estimate"),
               always("0.7.0", None, "V1 max seq len check")), anywhere=True),
    _row("no_cache_blocks", "failure", "No available memory for the cache blocks",
         r"No available memory for the cache blocks", _cause("no_kv_memory"), anywhere=True),
    _row("profile_error", "failure", "Error in memory profiling", r"Error in memory profiling",
         _cause("memory_freed_during_profiling"), anywhere=True),
    _row("oom", "failure", "out of memory", r"CUDA out of memory|CUDA error: out of memory",
         _cause("cuda_out_of_memory"), anywhere=True),
    _row("oom_error", "failure", "OutOfMemoryError", r"OutOfMemoryError", _cause("cuda_out_of_memory"), anywhere=True),
    _row("engine_failed", "failure", "failed to start", r"^EngineCore failed to start", _cause("engine_failed")),
    _row("worker_died", "failure", " died, exit code", r"^Worker \S+ pid \d+ died, exit code",
         _cause("worker_died")),
    _row("method_error", "failure", "Error executing metho", r"^Error executing metho", _cause("exception")),
    _row("process_failed", "failure", "Process ", r"^Process [\w-]+:$", _cause("exception")),
    _row("traceback", "failure", "Traceback", r"^Traceback \(most recent call last\)", _cause("exception")),
    _row("exception_line", "exception", "Error", r"^(?:[\w.]+\.)?(?P<type>\w*Error)(?:\([\w.]*\))?(?:: (?P<text>.*))?$",
         _exception_line),
    _row("frame", "frame", "File \"", r'^File "(?P<path>[^"]+)", line \d+, in (?P<func>[\w<>]+)', _frame),
)

GENERIC_CAUSES = ("engine_failed", "worker_died", "exception")
# Kinds only a vLLM log prints: engine detection counts them (failures and frames are shared shapes).
SPECIFIC_KINDS = frozenset(r.kind for r in FORMATS) - {"failure", "exception", "frame", "args_tail"}
BY_NAME = {row.name: row for row in FORMATS}
# What the log reader parses on every line: the serving lines (IDLE_NEEDLES) only end a startup, looked for
# apart (collectors/vllm/plugin.py).
STARTUP_FORMATS = tuple(r for r in FORMATS if r.needle not in IDLE_NEEDLES)
assert len(BY_NAME) == len(FORMATS), "line-format names must be unique"
