"""SGLang's startup-log line formats, 0.2.15–0.5.23: one row per shape, with the releases that
print it (shared research notes §1, format strings read from the release wheels).

Rows are tried in order; the first whose needle is in the message, whose pattern matches and
whose extractor accepts wins. Start-anchored rows come first (their prefixes are disjoint),
then rows that search anywhere in the message (failures and warnings, which SGLang wraps in
exception text). Sizes come out as int bytes in keys ending ``_bytes``.
"""

from __future__ import annotations

import re
from typing import Any, Dict, Optional, Tuple

from kvforensics.collectors.lineformat import Lazy, LineFormat, always, first, when
from kvforensics.collectors.sglang.server_args import parse_server_args
from kvforensics.collectors.units import GB, GIB

# Every value is printed with "{:.2f}", so a figure is only known to half a hundredth.
PRINT_TOLERANCE_BYTES = GIB // 200  # 0.005 GiB ≈ 5.4 MB

_NUM = r"-?\d+(?:\.\d+)?"


# Plausible ranges: a figure outside them is not SGLang's (a corrupted or forged line). The
# extractor then refuses the line (lineformat.match skips it), so it is reported as unrecognised,
# never a crash and never a number the model trusts.
MAX_GIB = float(1 << 20)  # 1 PiB of GPU or host memory in one figure
MAX_COUNT = 10**13  # tokens, requests, lengths


class Implausible(ValueError):
    """A figure outside the range SGLang can print."""


def _gib(value: Optional[str]) -> Optional[int]:
    return None if value is None else int(round(_bounded(float(value), MAX_GIB) * GIB))


def _gb(value: Optional[str]) -> Optional[int]:
    return None if value is None else int(round(_bounded(float(value), MAX_GIB) * GB))


def _bounded(x: float, limit: float) -> float:
    if not -limit <= x <= limit:  # also NaN and the infinities
        raise Implausible("{!r} is out of range".format(x))
    return x


def _count(text: str, low: int = 0) -> int:
    if len(text.lstrip("-")) > 16:
        raise Implausible("{} digits".format(len(text)))
    n = int(text)
    if not low <= n <= MAX_COUNT:
        raise Implausible("{} is out of range".format(n))
    return n


def _find(pattern: "re.Pattern[str]", text: str) -> Optional[str]:
    m = pattern.search(text)
    return m.group(1) if m else None


_DIGITS = re.compile(r"\d+")


def _int_list(text: str) -> Tuple[int, ...]:
    values = _DIGITS.findall(text)
    if len(values) > 4096:
        raise Implausible("{} batch sizes".format(len(values)))
    return tuple(_count(x) for x in values)


_AVAIL = re.compile(r"avail mem=(" + _NUM + r") ?GB", re.IGNORECASE)
_USAGE = re.compile(r"mem usage=(" + _NUM + r") ?GB", re.IGNORECASE)
_ELAPSED = re.compile(r"(?:Time elapsed: |elapsed=)(" + _NUM + r") ?s")
_BS = re.compile(r"\bbs=?\s?\[([^\]]*)\]")
_DTYPE_FIELD = re.compile(r"\bdtype=([^,]+)")
_QUANT_FIELD = re.compile(r"\bquant=([^,]+)")
_TYPE_FIELD = re.compile(r"\btype=([^,]+)")
_MAMBA_EXTRA = re.compile(r"intermediate_\w+ size: (" + _NUM + r") ?GB")


# --- extractors ----------------------------------------------------------------------------

def _avail(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"avail_bytes": _gib(m.group(1))}


def _used(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"used_bytes": _gib(m.group(1))}


def _empty(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {}


def _baseline(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"used_bytes": _gib(m.group(1)), "baseline": True}


def _load_end(m: "re.Match[str]", msg: str) -> Optional[Dict[str, Any]]:
    """Fields wherever they stand (releases add and reorder them: ``quant=``, ``fmt=``, …)."""
    avail = _find(_AVAIL, msg)
    if avail is None:
        return None
    model_type = _find(_TYPE_FIELD, msg)
    return {"avail_bytes": _gib(avail), "used_bytes": _gib(_find(_USAGE, msg)),
            "model_type": model_type.strip() if model_type else None, "dtype": _find(_DTYPE_FIELD, msg),
            "quant": _find(_QUANT_FIELD, msg)}


def _no_room(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"cause": "weights_leave_no_memory", "mfs": _bounded(float(m.group(1)), 1.0),
            "min_mfs": _bounded(float(m.group(2)), 1.0) if m.group(2) else None}


def _mamba(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"max_size": _count(m.group("n")) if m.group("n") else None, "conv_bytes": _gib(m.group("conv")),
            "ssm_bytes": _gib(m.group("ssm")),
            "intermediate_bytes": sum(_gib(x) or 0 for x in _MAMBA_EXTRA.findall(msg))}


def _summary(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    k = m.group("K")
    return {"max_total_num_tokens": _count(m.group("T")),
            "chunked_prefill_size": None if k in (None, "None") else int(_bounded(int(k), MAX_COUNT)),
            "max_prefill_tokens": _count(m.group("P")), "max_running_requests": _count(m.group("R")),
            "context_len": _count(m.group("C"), low=1), "avail_bytes": _gib(m.group("avail"))}


def _graph(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    rest, what = m.group("rest"), m.group("what").strip()
    data: Dict[str, Any] = {"phase": what or "decode", "draft": "draft" in what.lower(),
                            "avail_bytes": _gib(_find(_AVAIL, rest))}
    bs = _find(_BS, rest)
    if bs is not None:
        data["batch_sizes"] = _int_list(bs)
    if m.group("edge") == "end":
        data["used_bytes"] = _gib(_find(_USAGE, rest))
        elapsed = _find(_ELAPSED, rest)
        data["elapsed_s"] = _bounded(float(elapsed), 1e7) if elapsed else None
    return data


def _graph_bs(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"batch_sizes": _int_list(m.group(1))}


def _server_args(m: "re.Match[str]", msg: str) -> Optional[Dict[str, Any]]:
    args = parse_server_args(m.group("body"))
    return None if args is None else {"args": args}


def _kv_dtype(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"dtype": m.group(1)}


def _swa_split(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"full_tokens": _count(m.group("full")) if m.group("full") else None, "swa_tokens": _count(m.group("swa"))}


def _swa_pool(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"bytes": _gib(m.group(1)), "swa_tokens": _count(m.group(2)), "full_tokens": _count(m.group(3))}


def _post_capture(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"draft": bool(m.group("draft")), "dtype": m.group("dtype"), "tokens": _count(m.group("tokens")),
            "kv_bytes": _gib(m.group("kv")), "avail_bytes": _gib(m.group("avail"))}


def _hicache_new(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"label": m.group("label").strip() or None, "tokens": _count(m.group("tokens")),
            "host_bytes": _gb(m.group("gb"))}


def _hicache_old(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"label": None, "tokens": None, "host_bytes": _gb(m.group(1))}


def _mm_reserve(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"bytes": _gib(m.group(1))}


def _kv_pool(m: "re.Match[str]", msg: str) -> Optional[Dict[str, Any]]:
    label = (m.group("label") or "").strip()
    if ":" in label or len(label.split()) > 3:  # prose that merely mentions the KV cache
        return None
    k, v, kv = _gib(m.group("k")), _gib(m.group("v")), _gib(m.group("kv"))
    return {"label": label, "state": m.group("state"), "dtype": m.group("dtype"),
            "tokens": _count(m.group("tokens")) if m.group("tokens") else None, "k_bytes": k, "v_bytes": v,
            "kv_bytes": kv if kv is not None else (k or 0) + (v or 0),
            "layout": "single" if kv is not None else "k+v"}


def _cause(cause: str):  # type: ignore[no-untyped-def]
    return lambda m, msg: {"cause": cause}


def _negative_profile(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"cause": "no_kv_budget", "requested": _count(m.group(1)), "profiled": -_count(m.group(2).lstrip("-"))}


def _process_exception(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"cause": "exception", "process": m.group(1)}


def _exception_line(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"type": m.group("type"), "text": (m.group("text") or "").strip()}


def _frame(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"path": m.group("path"), "func": m.group("func")}


def _host_short(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"cause": "host_memory_short", "requested_bytes": _gb(m.group(1)), "free_bytes": _gb(m.group(2))}


def _mfs_adjusted(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"from": _bounded(float(m.group(1)), 1.0), "to": _bounded(float(m.group(2)), 1.0)}


def _requests_reduced(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"requested": _count(m.group(1)), "effective": _count(m.group(2))}


def _cap_ignored(m: "re.Match[str]", msg: str) -> Dict[str, Any]:
    return {"requested": _count(m.group(1)), "profiled": _count(m.group(2))}


# --- era clues that need more than the row ------------------------------------------------

def _text_has(needle: str):  # type: ignore[no-untyped-def]
    return lambda data, text: needle in text


def _kv_clues() -> Tuple:  # type: ignore[type-arg]
    return (
        first(when(lambda d, t: d.get("tokens") is None, "0.4.2", "0.4.3",
                   "'KV Cache is allocated' without #tokens"),
              when(lambda d, t: bool(d.get("dtype")), "0.5.13", None, "'KV Cache is allocated. dtype:'"),
              always("0.4.4", "0.5.12", "'KV Cache is allocated. #tokens:' without dtype")),
        when(lambda d, t: d.get("layout") == "single" and d.get("tokens") is not None, "0.4.6", None,
             "MLA 'KV size' line"),
        # Labelled pool lines ("Full "/"SWA ") from 0.5.17, "VA upper bound" from 0.5.18 (sglang_source_facts §7).
        when(lambda d, t: bool(d.get("label")), "0.5.17", None, "labelled KV pool line"),
        when(lambda d, t: d.get("state") == "VA upper bound", "0.5.18", None, "'KV Cache VA upper bound' line"),
    )


def _graph_clues(end: bool) -> Tuple:  # type: ignore[type-arg]
    def phase(d: Dict[str, Any]) -> str:
        return str(d.get("phase", ""))

    clues = [
        first(when(_text_has("num_tokens_per_req"), "0.5.16", None, "'num_tokens_per_req' in graph line"),
              when(_text_has("num_tokens_per_bs"), "0.5.14", "0.5.15", "'num_tokens_per_bs' in graph line")),
        first(when(lambda d, t: phase(d).startswith(("target", "draft decode")) or "prefill" in phase(d),
                   "0.5.14", None, "'Capture target|draft decode|prefill … CUDA graph'"),
              when(lambda d, t: "piecewise" in phase(d), "0.5.6", "0.5.13", "piecewise CUDA graph lines")),
    ]
    if end:
        def timed(d: Dict[str, Any], t: str) -> bool:
            return "Time elapsed" in t and not d.get("draft")

        clues.append(first(
            when(lambda d, t: timed(d, t) and d.get("used_bytes") is None, "0.4.0", "0.4.3",
                 "graph end without mem usage"),
            # The order swapped in 0.4.6.post1 (counted as 0.4.6 here: versions carry no .postN).
            when(lambda d, t: timed(d, t) and t.find("mem usage") < t.find("avail mem"), "0.4.6", "0.5.13",
                 "graph end 'mem usage' before 'avail mem'"),
            when(timed, "0.4.4", "0.4.6", "graph end 'avail mem' before 'mem usage'")))
    return tuple(clues)


def _row(name: str, kind: str, needle: str, pattern: str, extract, *clues,
         anywhere: bool = False) -> LineFormat:  # type: ignore[no-untyped-def]
    return LineFormat(name=name, kind=kind, needle=needle, pattern=Lazy(pattern), extract=extract,
                      clues=tuple(clues), anywhere=anywhere)


FORMATS: Tuple[LineFormat, ...] = (
    # (a) distributed init: 0.2.15–0.3.0 "Init nccl begin.", 0.3.6–0.5.20 "Init torch distributed
    # begin.", 0.5.21+ "Init parallel begin."
    _row("dist_begin", "dist_init_begin", " begin.", r"^Init (?P<what>torch distributed|nccl|parallel) begin\.",
         lambda m, msg: {"what": m.group("what")},
         first(when(lambda d, t: d["what"] == "nccl", None, "0.3.3", "'Init nccl begin'"),
               when(lambda d, t: d["what"] == "parallel", "0.5.21", None, "'Init parallel begin'"),
               always("0.3.4", "0.5.20", "'Init torch distributed begin'"))),
    # 0.4.4–0.5.8 "ends. mem usage=…", 0.5.9–0.5.20 "ends. elapsed=… s, mem usage=…"
    _row("dist_end", "dist_init_end", "GB",
         r"^Init torch distributed ends\.(?: elapsed=" + _NUM + r" s,)? mem usage=(" + _NUM + r") GB", _used,
         first(when(_text_has("elapsed="), "0.5.9", "0.5.20", "'Init torch distributed ends. elapsed='"),
               always("0.4.4", "0.5.8", "'Init torch distributed ends. mem usage'"))),
    # 0.5.21+: the baseline is taken after parallel init, so dist-init memory is no longer shown.
    _row("memory_baseline", "dist_init_end", "GB", r"^Memory baseline taken\. mem usage=(" + _NUM + r") GB",
         _baseline, always("0.5.21", None, "'Memory baseline taken'")),
    # (b) weights: begin unchanged since 0.2.15; end gains "mem usage" (0.4.4), "elapsed" (0.5.9),
    # loses "dtype=" and gains "quant=…" (0.5.10).
    _row("load_begin", "load_begin", "GB", r"^Load weight begin\. (?i:avail mem)=(" + _NUM + r") ?GB", _avail),
    _row("load_commit", "load_commit", "Committed real weights", r"^Load weight end\. Committed real weights",
         _empty),  # 0.5.18+ overlap mode
    _row("load_end", "load_end", "GB", r"^Load weight end\.", _load_end,
         first(when(lambda d, t: d.get("used_bytes") is None, None, "0.4.3", "'Load weight end' without mem usage"),
               when(lambda d, t: "elapsed=" not in t, "0.4.4", "0.5.8", "'Load weight end' with mem usage, no elapsed"),
               when(lambda d, t: bool(d.get("dtype")), "0.5.9", "0.5.9", "'Load weight end. elapsed=…, dtype='"),
               always("0.5.10", None, "'Load weight end' without dtype"))),
    _row("kv_dtype", "kv_dtype", "KV cache dtype", r"^Using KV cache dtype: (\S+)", _kv_dtype,
         always("0.5.3", "0.5.12", "'Using KV cache dtype'")),  # rank 0 only
    _row("swa_split", "swa_split", "indow memory pool",
         r"^Use [Ss]liding window memory pool(?P<all> \(all SWA\))?\. "
         r"(?:full_layer_tokens=(?P<full>\d+), )?swa_layer_tokens=(?P<swa>\d+)", _swa_split,
         first(when(_text_has("(all SWA)"), "0.5.9", None, "'sliding window memory pool (all SWA)'"),
               when(_text_has("Use Sliding"), "0.4.10", "0.5.6", "'Use Sliding window memory pool'"),
               always("0.5.7", None, "'Use sliding window memory pool'"))),
    _row("swa_pool", "swa_pool", "GB", r"^SWAKVPool mem usage: (" + _NUM + r") GB, swa size: (\d+), full size: (\d+)",
         _swa_pool, always("0.5.4", "0.5.17", "'SWAKVPool mem usage'")),
    _row("post_capture_sizing", "post_capture_sizing", "GB",
         r"^Post-capture KV sizing: max_total_num_tokens=(?P<tokens>\d+), free memory=(?P<free>" + _NUM + r") GB",
         lambda m, msg: {"tokens": _count(m.group("tokens")), "free_bytes": _gib(m.group("free"))},
         always("0.5.16", "0.5.16", "'Post-capture KV sizing: max_total_num_tokens='")),
    _row("post_capture_kv", "post_capture_kv", "GB",
         r"^Post-capture KV sizing: (?P<draft>draft )?KV cache allocated\. dtype: (?P<dtype>[^,]+), "
         r"#tokens: (?P<tokens>\d+), KV size: (?P<kv>" + _NUM + r") GB(?:, avail mem=(?P<avail>" + _NUM + r") GB)?",
         _post_capture,
         first(when(lambda d, t: bool(d.get("draft")), "0.5.22", None, "'Post-capture KV sizing: draft KV cache'"),
               always("0.5.17", None, "'Post-capture KV sizing: KV cache allocated'"))),
    _row("mamba_pool", "mamba_pool", "GB",
         r"^Mamba Cache is allocated\. (?:max_mamba_cache_size: (?P<n>\d+), )?"
         r"conv_state size: (?P<conv>" + _NUM + r") ?GB, ssm_state size: (?P<ssm>" + _NUM + r") ?GB", _mamba,
         first(when(lambda d, t: d.get("max_size") is not None, "0.5.4", None,
                    "'Mamba Cache is allocated. max_mamba_cache_size'"),
               always("0.5.2", "0.5.3", "'Mamba Cache is allocated' without max_mamba_cache_size"))),
    _row("pool_end", "pool_end", "GB", r"^Memory pool end\. avail mem=(" + _NUM + r") GB", _avail),
    # (e)/(f) graphs: "Capture cuda graph begin", "Capture draft extend cuda graph begin (step 1)",
    # "Capture piecewise CUDA graph end", "Capture target verify CUDA graph begin. backend=…".
    _row("graph_begin", "graph_begin", " begin",
         r"^Capture (?P<what>.*?)(?:cuda|CUDA|cpu|CPU|npu|NPU|xpu|XPU) graph (?P<edge>begin)\b(?P<rest>.*)$", _graph,
         *_graph_clues(end=False)),
    _row("graph_end", "graph_end", "graph end",
         r"^Capture (?P<what>.*?)(?:cuda|CUDA|cpu|CPU|npu|NPU|xpu|XPU) graph (?P<edge>end)\b(?P<rest>.*)$", _graph,
         *_graph_clues(end=True)),
    _row("graph_bs", "graph_bs", "graph bs", r"^Capture (?:cuda|CUDA) graph bs \[([^\]]*)\]", _graph_bs),
    # tqdm's description while graphs are captured, one per batch size (cuda_graph_runner.py capture:
    # f"Capturing batches ({bs=} {avail_mem=:.2f} GB)"): untagged (tqdm writes it bare, on the capturing rank
    # only), and the free memory at that moment: a log that stops mid-capture ends here.
    _row("graph_progress", "graph_progress", "Capturing batches",
         r"^Capturing batches \(bs=(\d+) avail_mem=(" + _NUM + r") GB\)",
         lambda m, msg: {"bs": _count(m.group(1)), "avail_bytes": _gib(m.group(2))}),
    # (g) scheduler summary, every rank ≤0.4.6, tp_rank 0 only since 0.4.7.
    _row("summary", "summary", "max_total_num_tokens=",
         r"^max_total_num_tokens=(?P<T>\d+), (?:chunked_prefill_size=(?P<K>-?\d+|None), )?"
         r"max_prefill_tokens=(?P<P>\d+), max_running_requests=(?P<R>\d+), context_len=(?P<C>\d+)"
         r"(?:, available_(?:gpu|cpu)_mem=(?P<avail>" + _NUM + r") GB)?", _summary,
         first(when(lambda d, t: d.get("avail_bytes") is not None, "0.4.7", None, "summary with available_gpu_mem"),
               when(_text_has("chunked_prefill_size"), "0.4.2", "0.4.6",
                    "summary with chunked_prefill_size, no available_gpu_mem"),
               always(None, "0.4.1", "summary without chunked_prefill_size"))),
    _row("server_args", "server_args", "server_args=", r"^server_args=(?P<body>(?:ServerArgs\(|\{).*)$",
         _server_args,
         first(when(lambda d, t: t.startswith("server_args={"), "0.5.19", None, "server_args printed as a dict"),
               always(None, "0.5.18", "server_args printed as ServerArgs(...)"))),
    _row("hicache_host", "hicache_host", "GB",
         r"^Allocating (?P<label>.*?) ?hierarchical KV host pool: (?P<tokens>\d+) tokens, (?P<gb>" + _NUM
         + r") GB host memory", _hicache_new),
    _row("hicache_host_old", "hicache_host", "GB",
         r"^Allocating (" + _NUM + r") GB host memory for hierarchical KV cache", _hicache_old),
    _row("mm_reserve", "mm_reserve", "GB", r"^Reserving (" + _NUM + r") GB of the KV budget for post-sizing multimodal",
         _mm_reserve),
    # (c) KV pool: MHA "K size/V size" (0.4.2+), MLA "KV size" (0.4.6+), "dtype:" (0.5.13+),
    # "Full "/"SWA " labels and "VA upper bound" (0.5.18+). A label may precede it.
    _row("kv_pool", "kv_pool", "GB",
         r"^(?:(?P<label>\S.*?) )?KV Cache (?P<state>is allocated|VA upper bound)\.? "
         r"(?:dtype: (?P<dtype>[^,]+), )?(?:#tokens: (?P<tokens>\d+), )?"
         r"(?:K size: (?P<k>" + _NUM + r") GB, V size: (?P<v>" + _NUM + r") GB|KV size: (?P<kv>" + _NUM + r") GB)",
         _kv_pool, *_kv_clues()),
    # Failures: SGLang raises these inside exception text, so search anywhere. Specific causes
    # first (the message strings of each release: sglang_source_facts §8), generic ones last.
    _row("negative_profile", "failure", "profiled value",
         r"max_total_tokens=(\d+) is larger than the profiled value (-\d+|0)\b", _negative_profile,
         always(None, "0.5.10", "a negative profiled token count (0.5.11+ stops before printing it)"), anywhere=True),
    _row("not_enough_memory", "failure", "Not enough memory",
         r"Not enough memory\. Please try to increase --mem-fraction-static", _cause("not_enough_memory"),
         anywhere=True),
    _row("weights_leave_no_memory", "failure", "Loaded weights leave",
         r"Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=(" + _NUM + r")"
         r"(?:\. Raise --mem-fraction-static above (" + _NUM + r"))?", _no_room,
         always("0.5.14", None, "'Loaded weights leave no GPU memory'"), anywhere=True),
    _row("host_memory_short", "failure", "GB",
         r"Not enough host memory(?: for [^.]*)? ?(?:available)?\. Requesting (" + _NUM + r") GB but only have ("
         + _NUM + r") GB free", _host_short, anywhere=True),
    _row("graph_failed", "failure", "graph failed", r"Capture (?:\w+ )*(?:cuda|CUDA) graph failed",
         _cause("cuda_graph_capture_failed"), anywhere=True),
    _row("prefill_graph_failed", "failure", "Fail when using backend",
         r"Fail when using backend: \S+ for prefill runner",
         _cause("cuda_graph_capture_failed"), anywhere=True),
    _row("unbalanced_raised", "failure", "memory capacity is unbalanced",
         r"(?:ValueError|RuntimeError|Exception): The memory capacity is unbalanced", _cause("unbalanced_memory"),
         anywhere=True),
    _row("oom", "failure", "out of memory", r"CUDA out of memory|CUDA error: out of memory",
         _cause("cuda_out_of_memory"),
         anywhere=True),
    _row("oom_error", "failure", "OutOfMemoryError", r"OutOfMemoryError", _cause("cuda_out_of_memory"), anywhere=True),
    _row("oom_allocator", "failure", "failed with OOM", r"memory allocation failed with OOM on device",
         _cause("cuda_out_of_memory"), anywhere=True),
    _row("cuda_error", "failure", "CUDA Error", r"^CUDA Error: (?!out of memory)", _cause("cuda_error")),
    _row("nccl", "failure", "NCCL", r"NCCL error|nccl(?:UnhandledCuda|System|Internal|InvalidUsage)Error",
         _cause("nccl_error"), anywhere=True),
    _row("scheduler_died", "failure", "scheduler", r"Rank (\d+) scheduler (?P<how>is dead|died during initialization)",
         _cause("scheduler_died"),
         first(when(_text_has("is dead"), "0.4.2", "0.5.9", "'Rank N scheduler is dead'"),
               always("0.5.10", None, "'Rank N scheduler died during initialization'")), anywhere=True),
    # The name starts where a word does: searched from every letter of a long word, it would read to
    # the word's end each time (quadratic).
    _row("process_exception", "failure", " hit an exception",
         r"(?<!\w)(\w+) hit an exception", _process_exception, anywhere=True),
    _row("process_exception_old", "failure", "Exception in ",
         r"^Exception in (run_tp_server|ModelTpServer|ControllerSingle|ControllerMulti|\w+)\b", _process_exception),
    _row("child_failed", "failure", "Received sigquit", r"Received sigquit from a child proces", _cause("child_failed"),
         anywhere=True),
    _row("init_failed", "failure", "Initialization failed", r"^Initialization failed", _cause("exception")),
    _row("traceback", "failure", "Traceback", r"^Traceback \(most recent call last\)", _cause("exception")),
    # The exception a traceback ends with ("ValueError: …", a bare "AssertionError").
    _row("exception_line", "exception", "Error", r"^(?:[\w.]+\.)?(?P<type>\w*Error)(?:: (?P<text>.*))?$",
         _exception_line),
    _row("exception_line_exc", "exception", "Exception", r"^(?:[\w.]+\.)?(?P<type>\w*Exception)(?:: (?P<text>.*))?$",
         _exception_line),
    # Traceback frames name the stage a failure happened in.
    _row("frame", "frame", "File \"", r'^File "(?P<path>[^"]+)", line \d+, in (?P<func>[\w<>]+)', _frame),
    _row("unbalanced", "unbalanced", "memory capacity is unbalanced", r"The memory capacity is unbalanced", _empty,
         anywhere=True),
    _row("mfs_adjusted", "mfs_adjusted", "Dynamically adjusted",
         r"Dynamically adjusted --mem-fraction-static from: (" + _NUM + r") to: (" + _NUM + r")", _mfs_adjusted,
         anywhere=True),
    _row("requests_reduced", "requests_reduced", "was reduced from",
         r"max_running_requests was reduced from the requested (\d+) to (\d+)", _requests_reduced, anywhere=True),
    _row("cap_ignored", "cap_ignored", "profiled value",
         r"max_total_tokens=(\d+) is larger than the profiled value (\d+)",
         _cap_ignored, anywhere=True),
)

BY_NAME = {row.name: row for row in FORMATS}
assert len(BY_NAME) == len(FORMATS), "line-format names must be unique"
