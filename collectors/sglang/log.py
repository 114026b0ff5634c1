"""Recognise SGLang (0.2.15–0.5.23) startup log lines and turn them into events.

Pure functions only: text in, frozen ``LogEvent`` records out. Reading files lives in
``collectors/logfile.py``; what the events mean lives in ``agent/``.

Units: every GPU-memory figure SGLang prints as "GB" is GiB (2**30 bytes):
``get_available_gpu_memory`` returns ``free / (1 << 30)`` and ``mem_cache/memory_pool.py``
divides by ``GB = 1024 * 1024 * 1024``. The one exception is HiCache host memory
(``Allocating … GB host memory``, ``--hicache-size``), which is decimal (1e9).
Line formats are from shared research notes §1 (format strings per version); each
recogniser cites the versions it covers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Tuple

from collectors.sglang.server_args import parse_server_args

GIB = 1 << 30  # SGLang "GB" on GPU lines (see module docstring)
GB = 10**9  # HiCache host-memory "GB" (mem_cache/memory_pool_host.py prints bytes / 1e9)

# Every value is printed with "{:.2f}", so a figure is only known to half a hundredth.
PRINT_TOLERANCE_BYTES = GIB // 200  # 0.005 GiB ≈ 5.4 MB


@dataclass(frozen=True)
class LogEvent:
    """One recognised startup-log record.

    ``rank`` is the record's rank tag as printed (``"TP3"``, ``"DP1 TP3"``), ``""`` for a
    record with a timestamp but no tag (single-GPU runs since 0.4.7, and the main process),
    and ``None`` when the line had no SGLang prefix at all (traceback text, custom logging).
    ``data`` holds the parsed values; sizes are int bytes and end in ``_bytes``.
    """

    kind: str
    line: Optional[int]  # 1-based line number in the source; None when not counted
    offset: int  # byte offset of the line in the source (decompressed stream for .gz)
    rank: Optional[str]
    ts: Optional[str]
    data: Dict[str, Any] = field(default_factory=dict)
    text: str = ""  # the message, shortened, for evidence
    raw: str = ""  # the physical line, so a startup can be saved and parsed again elsewhere


# --- line prefixes -------------------------------------------------------------------------

# "[2026-01-01 10:00:00.123 DP1 TP3] msg" (0.3.6+), "[12:34:56 TP0] msg" (0.2.15–0.3.x).
# Searched, not matched: it may follow docker-compose "svc  | ", a journald header, a
# "--timestamps" prefix, or a tqdm bar the record was glued to.
_PREFIX = re.compile(
    r"\[(?P<ts>\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d{1,6})?|\d{2}:\d{2}:\d{2})"
    r"(?P<tags>(?: (?:DP|PP|ATTN_CP|MOE_DP|TP|EP)\d+)*)\] ?"
)
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
# 0.2.0 "[gpu_id=0] ", 0.2.9 "[gpu=0] " inside the message (tolerated, not a rank tag).
_LEGACY_GPU = re.compile(r"^\[gpu(?:_id)?=\d+\] ")
# journald: "Jan 05 10:00:00 host unit[123]: "; docker compose: "name  | ".
_EXTERNAL = re.compile(
    r"^(?:[A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2} \S+ [^\s:]+?(?:\[\d+\])?: |[\w.-]+\s+\| )"
)


def split_records(raw: str) -> List[Tuple[Optional[str], Optional[str], str]]:
    """Split one physical line into ``(ts, rank, message)`` records.

    Handles ANSI colour, CR/CRLF, tqdm redraws (``\\r``) and records glued after a progress
    bar. A part with no SGLang prefix yields ``(None, None, message)``.
    """
    out: List[Tuple[Optional[str], Optional[str], str]] = []
    text = _ANSI.sub("", raw)
    for part in text.replace("\r", "\n").split("\n"):
        if not part.strip():
            continue
        matches = list(_PREFIX.finditer(part))
        if not matches:
            out.append((None, None, _EXTERNAL.sub("", part, count=1).strip()))
            continue
        for i, m in enumerate(matches):
            end = matches[i + 1].start() if i + 1 < len(matches) else len(part)
            msg = part[m.end() : end].strip()
            out.append((m.group("ts"), m.group("tags").strip(), msg))
    return out


# --- message recognisers -------------------------------------------------------------------

_NUM = r"-?\d+(?:\.\d+)?"


def _gib(value: Optional[str]) -> Optional[int]:
    return None if value is None else int(round(float(value) * GIB))


def _gb(value: Optional[str]) -> Optional[int]:
    return None if value is None else int(round(float(value) * GB))


def _find(pattern: "re.Pattern[str]", text: str) -> Optional[str]:
    m = pattern.search(text)
    return m.group(1) if m else None


_AVAIL = re.compile(r"avail mem=(" + _NUM + r") ?GB")
_USAGE = re.compile(r"mem usage=(" + _NUM + r") ?GB")
_ELAPSED = re.compile(r"(?:Time elapsed: |elapsed=)(" + _NUM + r") ?s")
_BS = re.compile(r"\bbs=?\s?\[([^\]]*)\]")

# (a) distributed init: 0.2.15–0.3.0 "Init nccl begin.", 0.3.6–0.5.20 "Init torch distributed
# begin.", 0.5.21+ "Init parallel begin."
_DIST_BEGIN = re.compile(r"^Init (?:torch distributed|nccl|parallel) begin\.")
# 0.4.4–0.5.8 "ends. mem usage=…", 0.5.9–0.5.20 "ends. elapsed=… s, mem usage=…"
_DIST_END = re.compile(r"^Init torch distributed ends\.(?: elapsed=" + _NUM + r" s,)? mem usage=(" + _NUM + r") GB")
# 0.5.21+: the baseline is taken after parallel init, so dist-init memory is no longer shown.
_BASELINE = re.compile(r"^Memory baseline taken\. mem usage=(" + _NUM + r") GB")
# (b) weights: begin unchanged since 0.2.15; end gains "mem usage" (0.4.4), "elapsed" (0.5.9),
# loses "dtype=" and gains "quant=…" (0.5.10).
_LOAD_BEGIN = re.compile(r"^Load weight begin\. avail mem=(" + _NUM + r") GB")
_LOAD_END = re.compile(
    r"^Load weight end\. (?:elapsed=(?P<t>" + _NUM + r") s, )?type=(?P<type>[^,]+), (?P<mid>.*?)"
    r"avail mem=(?P<avail>" + _NUM + r") GB(?:, mem usage=(?P<used>" + _NUM + r") GB)?"
)
_LOAD_COMMIT = re.compile(r"^Load weight end\. Committed real weights")  # 0.5.18 overlap mode
_KV_DTYPE = re.compile(r"^Using KV cache dtype: (\S+)")  # 0.5.3–0.5.12, rank 0 only
_SWA_SPLIT = re.compile(
    r"^Use [Ss]liding window memory pool(?P<all> \(all SWA\))?\. "
    r"(?:full_layer_tokens=(?P<full>\d+), )?swa_layer_tokens=(?P<swa>\d+)"
)
_SWA_POOL = re.compile(r"^SWAKVPool mem usage: (" + _NUM + r") GB, swa size: (\d+), full size: (\d+)")
# (c) KV pool: MHA "K size/V size" (0.4.2+), MLA "KV size" (0.4.6+), "dtype:" (0.5.13+),
# "Full "/"SWA " labels and "VA upper bound" (0.5.18+).
_KV_POOL = re.compile(
    r"^(?:(?P<label>\S.*?) )?KV Cache (?P<state>is allocated|VA upper bound)\.? "
    r"(?:dtype: (?P<dtype>[^,]+), )?(?:#tokens: (?P<tokens>\d+), )?"
    r"(?:K size: (?P<k>" + _NUM + r") GB, V size: (?P<v>" + _NUM + r") GB|KV size: (?P<kv>" + _NUM + r") GB)"
)
_POST_CAPTURE_KV = re.compile(
    r"^Post-capture KV sizing: (?P<draft>draft )?KV cache allocated\. dtype: (?P<dtype>[^,]+), "
    r"#tokens: (?P<tokens>\d+), KV size: (?P<kv>" + _NUM + r") GB(?:, avail mem=(?P<avail>" + _NUM + r") GB)?"
)
_MAMBA = re.compile(
    r"^Mamba Cache is allocated\. (?:max_mamba_cache_size: (?P<n>\d+), )?"
    r"conv_state size: (?P<conv>" + _NUM + r") ?GB, ssm_state size: (?P<ssm>" + _NUM + r") ?GB"
)
_MAMBA_EXTRA = re.compile(r"intermediate_\w+ size: (" + _NUM + r") ?GB")
_POOL_END = re.compile(r"^Memory pool end\. avail mem=(" + _NUM + r") GB")
# (e)/(f) graphs: "Capture cuda graph begin", "Capture draft extend cuda graph begin (step 1)",
# "Capture piecewise CUDA graph end", "Capture target verify CUDA graph begin. backend=…".
_GRAPH = re.compile(
    r"^Capture (?P<what>.*?)(?:cuda|CUDA|cpu|CPU|npu|NPU|xpu|XPU) graph (?P<edge>begin|end)\b(?P<rest>.*)$"
)
_GRAPH_BS = re.compile(r"^Capture (?:cuda|CUDA) graph bs \[([^\]]*)\]")
_GRAPH_FAILED = re.compile(r"Capture (?:\w+ )*(?:cuda|CUDA) graph failed")
# (g) scheduler summary, every rank ≤0.4.6, tp_rank 0 only since 0.4.7.
_SUMMARY = re.compile(
    r"^max_total_num_tokens=(?P<T>\d+), (?:chunked_prefill_size=(?P<K>-?\d+|None), )?"
    r"max_prefill_tokens=(?P<P>\d+), max_running_requests=(?P<R>\d+), context_len=(?P<C>\d+)"
    r"(?:, available_(?:gpu|cpu)_mem=(?P<avail>" + _NUM + r") GB)?"
)
_SERVER_ARGS = re.compile(r"^server_args=(?P<body>(?:ServerArgs\(|\{).*)$")
_HICACHE_OLD = re.compile(r"^Allocating (" + _NUM + r") GB host memory for hierarchical KV cache")
_HICACHE_NEW = re.compile(
    r"^Allocating (?P<label>.*?) ?hierarchical KV host pool: (?P<tokens>\d+) tokens, (?P<gb>" + _NUM + r") GB host memory"
)
_HOST_SHORT = re.compile(
    r"Not enough host memory available\. Requesting (" + _NUM + r") GB but only have (" + _NUM + r") GB free"
)
_NOT_ENOUGH = re.compile(r"Not enough memory\. Please try to increase --mem-fraction-static")
_NO_ROOM = re.compile(
    r"Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=(" + _NUM + r")"
    r"\. Raise --mem-fraction-static above (" + _NUM + r")"
)
_OOM = re.compile(r"CUDA out of memory|OutOfMemoryError")
_UNBALANCED = re.compile(r"The memory capacity is unbalanced")
_VLM_ADJUST = re.compile(r"Dynamically adjusted --mem-fraction-static from: (" + _NUM + r") to: (" + _NUM + r")")
_REQS_REDUCED = re.compile(r"max_running_requests was reduced from the requested (\d+) to (\d+)")
_CAP_IGNORED = re.compile(r"max_total_tokens=(\d+) is larger than the profiled value (\d+)")
_MM_RESERVE = re.compile(r"^Reserving (" + _NUM + r") GB of the KV budget for post-sizing multimodal")


def parse_message(msg: str) -> Optional[Tuple[str, Dict[str, Any]]]:
    """Classify one message (prefix already removed). Returns ``(kind, data)`` or None."""
    msg = _LEGACY_GPU.sub("", msg, count=1)
    if not msg:
        return None
    head = msg[0]
    if head == "L":
        m = _LOAD_BEGIN.match(msg)
        if m:
            return "load_begin", {"avail_bytes": _gib(m.group(1))}
        m = _LOAD_END.match(msg)
        if m:
            mid = m.group("mid")
            dtype = _find(re.compile(r"dtype=([^,]+)"), mid)
            quant = _find(re.compile(r"quant=([^,]+)"), mid)
            return "load_end", {
                "avail_bytes": _gib(m.group("avail")),
                "used_bytes": _gib(m.group("used")),
                "model_type": m.group("type").strip(),
                "dtype": dtype,
                "quant": quant,
            }
        if _LOAD_COMMIT.match(msg):
            return "load_commit", {}
        m = _NO_ROOM.search(msg)
        if m:
            return "failure", {"cause": "weights_leave_no_memory", "mfs": float(m.group(1)),
                               "min_mfs": float(m.group(2))}
    if head == "I":
        if _DIST_BEGIN.match(msg):
            return "dist_init_begin", {}
        m = _DIST_END.match(msg)
        if m:
            return "dist_init_end", {"used_bytes": _gib(m.group(1))}
    if head == "M":
        m = _POOL_END.match(msg)
        if m:
            return "pool_end", {"avail_bytes": _gib(m.group(1))}
        m = _BASELINE.match(msg)
        if m:
            return "dist_init_end", {"used_bytes": _gib(m.group(1)), "baseline": True}
        m = _MAMBA.match(msg)
        if m:
            extra = sum(_gib(x) or 0 for x in _MAMBA_EXTRA.findall(msg))
            return "mamba_pool", {
                "max_size": int(m.group("n")) if m.group("n") else None,
                "conv_bytes": _gib(m.group("conv")),
                "ssm_bytes": _gib(m.group("ssm")),
                "intermediate_bytes": extra,
            }
    if head == "m":
        m = _SUMMARY.match(msg)
        if m:
            k = m.group("K")
            return "summary", {
                "max_total_num_tokens": int(m.group("T")),
                "chunked_prefill_size": None if k in (None, "None") else int(k),
                "max_prefill_tokens": int(m.group("P")),
                "max_running_requests": int(m.group("R")),
                "context_len": int(m.group("C")),
                "avail_bytes": _gib(m.group("avail")),
            }
    if head == "C":
        m = _GRAPH.match(msg)
        if m:
            rest = m.group("rest")
            what = m.group("what").strip()
            data: Dict[str, Any] = {
                "phase": what or "decode",
                "draft": "draft" in what.lower(),
                "avail_bytes": _gib(_find(_AVAIL, rest)),
            }
            bs = _find(_BS, rest)
            if bs is not None:
                data["batch_sizes"] = _int_list(bs)
            if m.group("edge") == "end":
                data["used_bytes"] = _gib(_find(_USAGE, rest))
                elapsed = _find(_ELAPSED, rest)
                data["elapsed_s"] = float(elapsed) if elapsed else None
                return "graph_end", data
            return "graph_begin", data
        m = _GRAPH_BS.match(msg)
        if m:
            return "graph_bs", {"batch_sizes": _int_list(m.group(1))}
    if head == "s":
        m = _SERVER_ARGS.match(msg)
        if m:
            args = parse_server_args(m.group("body"))
            if args is not None:
                return "server_args", {"args": args}
    if head == "U":
        m = _KV_DTYPE.match(msg)
        if m:
            return "kv_dtype", {"dtype": m.group(1)}
        m = _SWA_SPLIT.match(msg)
        if m:
            return "swa_split", {
                "full_tokens": int(m.group("full")) if m.group("full") else None,
                "swa_tokens": int(m.group("swa")),
            }
    if head == "S":
        m = _SWA_POOL.match(msg)
        if m:
            return "swa_pool", {"bytes": _gib(m.group(1)), "swa_tokens": int(m.group(2)),
                                "full_tokens": int(m.group(3))}
    if head == "P":
        m = _POST_CAPTURE_KV.match(msg)
        if m:
            return "post_capture_kv", {
                "draft": bool(m.group("draft")),
                "dtype": m.group("dtype"),
                "tokens": int(m.group("tokens")),
                "kv_bytes": _gib(m.group("kv")),
                "avail_bytes": _gib(m.group("avail")),
            }
    if head == "A":
        m = _HICACHE_NEW.match(msg)
        if m:
            return "hicache_host", {"label": m.group("label").strip() or None,
                                    "tokens": int(m.group("tokens")), "host_bytes": _gb(m.group("gb"))}
        m = _HICACHE_OLD.match(msg)
        if m:
            return "hicache_host", {"label": None, "tokens": None, "host_bytes": _gb(m.group(1))}
    m = _MM_RESERVE.match(msg)
    if m:
        return "mm_reserve", {"bytes": _gib(m.group(1))}
    m = _KV_POOL.match(msg)
    if m:
        label = (m.group("label") or "").strip()
        if ":" in label or len(label.split()) > 3:  # prose that merely mentions the KV cache
            return None
        k, v, kv = _gib(m.group("k")), _gib(m.group("v")), _gib(m.group("kv"))
        return "kv_pool", {
            "label": label,
            "state": m.group("state"),
            "dtype": m.group("dtype"),
            "tokens": int(m.group("tokens")) if m.group("tokens") else None,
            "k_bytes": k,
            "v_bytes": v,
            "kv_bytes": kv if kv is not None else (k or 0) + (v or 0),
            "layout": "single" if kv is not None else "k+v",
        }
    return _failure_or_warning(msg)


def _failure_or_warning(msg: str) -> Optional[Tuple[str, Dict[str, Any]]]:
    if _NOT_ENOUGH.search(msg):
        return "failure", {"cause": "not_enough_memory"}
    m = _NO_ROOM.search(msg)
    if m:
        return "failure", {"cause": "weights_leave_no_memory", "mfs": float(m.group(1)),
                           "min_mfs": float(m.group(2))}
    m = _HOST_SHORT.search(msg)
    if m:
        return "failure", {"cause": "host_memory_short", "requested_bytes": _gb(m.group(1)),
                           "free_bytes": _gb(m.group(2))}
    if _GRAPH_FAILED.search(msg):
        return "failure", {"cause": "cuda_graph_capture_failed"}
    if _OOM.search(msg):
        return "failure", {"cause": "cuda_out_of_memory"}
    if _UNBALANCED.search(msg):
        return "unbalanced", {}
    m = _VLM_ADJUST.search(msg)
    if m:
        return "mfs_adjusted", {"from": float(m.group(1)), "to": float(m.group(2))}
    m = _REQS_REDUCED.search(msg)
    if m:
        return "requests_reduced", {"requested": int(m.group(1)), "effective": int(m.group(2))}
    m = _CAP_IGNORED.search(msg)
    if m:
        return "cap_ignored", {"requested": int(m.group(1)), "profiled": int(m.group(2))}
    return None


def _int_list(text: str) -> Tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text))


def parse_line(raw: str, line: Optional[int] = None, offset: int = 0) -> List[LogEvent]:
    """All events in one physical line (usually zero or one)."""
    events: List[LogEvent] = []
    for ts, rank, msg in split_records(raw):
        parsed = parse_message(msg)
        if parsed is None:
            continue
        kind, data = parsed
        text = msg if len(msg) <= 240 else msg[:237] + "..."
        events.append(LogEvent(kind, line, offset, rank, ts, data, text, raw))
    return events


def parse_lines(lines: Iterable[str]) -> List[LogEvent]:
    """Parse an iterable of text lines, numbering them from 1 (offsets are not tracked)."""
    events: List[LogEvent] = []
    for number, raw in enumerate(lines, 1):
        events.extend(parse_line(raw, number, 0))
    return events
