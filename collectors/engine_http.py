"""The engine's own HTTP view (optional): /server_info and /metrics, on loopback only.

SGLang: ``/server_info`` (0.5.6+; ``/get_server_info`` 0.4.0+) gives the resolved server args and
per-DP ``internal_states`` (``memory_usage``: weight/kvcache/graph GiB, token_capacity);
``/metrics`` (only with ``--enable-metrics``) gives live token usage and request counts.
vLLM: no server-info endpoint; its OpenAI API server always serves ``/metrics``, where the engine's
gauges appear unless it runs with ``--disable-log-stats``, and ``vllm:cache_config_info`` carries the
KV-cache configuration in its labels.
Only 127.0.0.1 is ever contacted, with a short timeout: a busy server must not stall a
diagnosis, and kvforensics never talks to other hosts from the probe.

Output: ``{"status", "url", "server_info": {...}|None, "metrics": {name: value},
"cache_config": {label: value}|None, "problems"}``.
SGLang metrics keep the first sample (ranks agree). vLLM labels its samples per engine (data
parallel ranks, ``engine="0"``...): request counts and preemptions are summed over them, cache
usage keeps the worst engine.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Dict, Iterator, List, Optional, Tuple

from collectors.redact import redact_mapping

NAME = "engine_http"
TIMEOUT_S = 0.5
READ_LIMIT = 4 << 20
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "0.0.0.0", "::1", "::", None)
DEFAULT_PORTS = {"sglang": 30000, "vllm": 8000}
WANTED = ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage", "sglang:num_used_tokens",
          "sglang:max_total_num_tokens", "sglang:kv_used_tokens", "sglang:kv_available_tokens",
          "sglang:gen_throughput", "sglang:startup_available_gpu_memory_gb", "sglang:context_len")
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")

# vLLM metric names, as registered in vLLM's own source (read in the PyPI wheels of 0.4.3, 0.6.3,
# 0.8.5, 0.10.2, 0.11.0 and 0.33.0):
#   V0 engine: vllm/engine/metrics.py, Metrics.__init__ (all of 0.4.3 .. 0.11.0);
#   V1 engine: vllm/v1/metrics/loggers.py, PrometheusStatLogger.__init__ (0.8.5 .. 0.33.0).
# Cache usage is a 0..1 fraction despite "_perc" (V0 LLMEngine._get_stats: 1 - free/total blocks;
# V1 BlockPool.get_usage, "between 0.0 and 1.0"). 0.4.3 to 0.8.5 serve only vllm:gpu_cache_usage_perc
# (V0 and V1 alike); V1 in 0.10.2 serves it next to vllm:kv_cache_usage_perc (renamed in 0.9, says its
# comment); 0.11.0 hides the old name behind --show-hidden-metrics-for-version; 0.33.0 has only the
# new one. Both are kept, each under its own name.
VLLM_WORST = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
# Preemptions: V0 and 0.8.5's V1 register the Counter as "vllm:num_preemptions_total", V1 from 0.10.2
# as "vllm:num_preemptions"; prometheus_client serves both as the sample vllm:num_preemptions_total.
VLLM_SUMMED = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:num_preemptions_total")
# An info gauge (value 1) whose labels are str() of every CacheConfig attribute (CacheConfig.metrics_info:
# vllm/config.py up to 0.8.5, vllm/config/cache.py from 0.10); V1 0.10+ adds an "engine" label and one
# sample per engine (PrometheusStatLogger.log_metrics_info). 0.4.3 registers Info("vllm:cache_config"),
# which prometheus_client serves under the same sample name.
VLLM_CACHE_INFO = "vllm:cache_config_info"

# cache_config bounds: the labels are a dump of a config object that grows every release (37 attributes
# in 0.33.0), so the ones a memory diagnosis reads are kept first and the rest fill up to 32.
CACHE_CONFIG_MAX_LABELS = 32
CACHE_CONFIG_MAX_STR = 64
CACHE_CONFIG_MAX_NUMBER = 1e15
CACHE_CONFIG_FIRST = ("block_size", "num_gpu_blocks", "num_cpu_blocks", "gpu_memory_utilization", "cache_dtype",
                      "kv_cache_memory_bytes", "num_gpu_blocks_override", "swap_space_bytes", "cpu_offload_gb",
                      "enable_prefix_caching", "sliding_window", "kv_cache_size_tokens", "kv_cache_max_concurrency")
# Not a CacheConfig attribute but the sample's engine index; the config (num_gpu_blocks included) is
# the server's, so it is dropped rather than reported as engine 0's.
CACHE_CONFIG_SKIP = ("engine",)

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*\"")
_INT = re.compile(r"[+-]?[0-9]+\Z")
_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\Z")
_ESCAPES = {"\\": "\\", "\"": "\"", "n": "\n"}

Sample = Tuple[str, Dict[str, str], float]


def parse_metrics(text: str) -> Dict[str, float]:
    """The first sample of each wanted metric from Prometheus text exposition (SGLang)."""
    out: Dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m or m.group(1) not in WANTED or m.group(1) in out:
            continue
        try:
            out[m.group(1)] = float(m.group(3))
        except ValueError:
            continue
    return out


def _label_value(line: str, pos: int) -> Optional[Tuple[str, int]]:
    """The unescaped value of a quoted label value opening at ``pos`` (just past its quote), and the
    position past its closing quote. Only \\\\, \\" and \\n are escapes in the text format; any other
    backslash stands for itself."""
    chars: List[str] = []
    while pos < len(line):
        c = line[pos]
        if c == "\"":
            return "".join(chars), pos + 1
        if c == "\\" and pos + 1 < len(line) and line[pos + 1] in _ESCAPES:
            chars.append(_ESCAPES[line[pos + 1]])
            pos += 2
            continue
        chars.append(c)
        pos += 1
    return None  # no closing quote: a truncated or garbled line


def parse_labels(line: str, pos: int) -> Optional[Tuple[Dict[str, str], int]]:
    """The labels of ``{a="x",b="y"}`` opening at ``pos`` (on the brace) and the position past the
    closing brace; None if malformed. Braces and commas inside quoted values are data."""
    labels: Dict[str, str] = {}
    pos += 1
    while True:
        while pos < len(line) and line[pos] in " \t":
            pos += 1
        if pos < len(line) and line[pos] == "}":
            return labels, pos + 1
        m = _LABEL_NAME.match(line, pos)
        if m is None:
            return None
        value = _label_value(line, m.end())
        if value is None:
            return None
        labels.setdefault(m.group(1), value[0])
        pos = value[1]
        while pos < len(line) and line[pos] in " \t":
            pos += 1
        if pos < len(line) and line[pos] == ",":
            pos += 1  # a trailing comma before "}" is allowed
        elif pos >= len(line) or line[pos] != "}":
            return None


def finite(text: str) -> Optional[float]:
    """A sample value as a finite float; None for NaN, ±Inf and anything that is not a number."""
    if not _FLOAT.match(text):
        return None  # also refuses what float() alone would take: "nan", "1_000", " 1"
    value = float(text)
    return value if math.isfinite(value) else None


def parse_sample(line: str) -> Optional[Sample]:
    """(name, labels, value) of one exposition line; None for comments, blanks, garbage and
    non-finite values (a NaN must not reach the snapshot: it is not JSON)."""
    m = _NAME.match(line)
    if m is None:
        return None
    labels: Dict[str, str] = {}
    pos = m.end()
    if pos < len(line) and line[pos] == "{":
        parsed = parse_labels(line, pos)
        if parsed is None:
            return None
        labels, pos = parsed
    if pos == m.end() and not line[pos:pos + 1].isspace():
        return None  # the name runs into something that is neither a label set nor a blank
    rest = line[pos:].split()
    if len(rest) not in (1, 2):
        return None  # a value and at most a timestamp
    value = finite(rest[0])
    return None if value is None else (m.group(0), labels, value)


def iter_samples(text: str, names: Tuple[str, ...]) -> Iterator[Sample]:
    """The samples of the named metrics, each (name, label set) once: the format forbids repeats,
    and counting one twice would inflate a sum."""
    seen = set()
    for line in text.splitlines():
        line = line.lstrip(" \t")
        if not line.startswith(names):
            continue  # cheap filter first: vLLM serves hundreds of histogram lines we never read
        sample = parse_sample(line)
        if sample is None or sample[0] not in names:
            continue
        key = (sample[0], tuple(sorted(sample[1].items())))
        if key not in seen:
            seen.add(key)
            yield sample


def config_value(text: str) -> Any:
    """A cache_config label value as JSON: int or float where it parses and is sane, None for
    Python's "None" and for absurd or non-finite numbers, else the string (cut to 64 chars)."""
    if _INT.match(text):
        number: float = int(text)
    elif _FLOAT.match(text):
        number = float(text)
    elif text == "None" or text.lower().lstrip("+-") in ("nan", "inf", "infinity"):
        return None
    else:
        return text if len(text) <= CACHE_CONFIG_MAX_STR else text[:CACHE_CONFIG_MAX_STR - 1] + "…"
    return number if math.isfinite(number) and abs(number) <= CACHE_CONFIG_MAX_NUMBER else None


def cache_config(labels: Dict[str, str]) -> Dict[str, Any]:
    """The bounded cache_config section from the labels of vllm:cache_config_info."""
    names = [n for n in CACHE_CONFIG_FIRST if n in labels]
    names += [n for n in labels if n not in CACHE_CONFIG_FIRST + CACHE_CONFIG_SKIP and len(n) <= CACHE_CONFIG_MAX_STR]
    return redact_mapping({n: config_value(labels[n]) for n in names[:CACHE_CONFIG_MAX_LABELS]})


def parse_vllm_metrics(text: str) -> Tuple[Dict[str, float], Optional[Dict[str, Any]]]:
    """(metrics, cache_config) from a vLLM /metrics page: request counts and preemptions summed
    over engines, cache usage the worst engine's, cache_config from the first info sample (engines
    of one server share one CacheConfig; from 0.10 its num_gpu_blocks is already the sum over data
    parallel engines, added up by the front end at the engines' handshake)."""
    metrics: Dict[str, float] = {}
    config: Optional[Dict[str, Any]] = None
    for name, labels, value in iter_samples(text, VLLM_WORST + VLLM_SUMMED + (VLLM_CACHE_INFO,)):
        if name == VLLM_CACHE_INFO:
            if config is None:
                config = cache_config(labels)
        elif name in VLLM_WORST:
            metrics[name] = max(value, metrics.get(name, value))
        else:
            metrics[name] = metrics.get(name, 0.0) + value
    return metrics, config


def whole_lines(body: bytes) -> str:
    """The body as text; if the read limit cut it, without its last, partial line (a cut "123"
    must not read as "12")."""
    if len(body) >= READ_LIMIT:
        body = body[:body.rfind(b"\n") + 1]
    return body.decode("utf-8", "replace")


def _get(url: str) -> Optional[bytes]:
    import urllib.error  # here, not at the top: only hosts running an engine pay for it
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as resp:  # noqa: S310 - loopback only
            return resp.read(READ_LIMIT)
    except (urllib.error.URLError, OSError, ValueError):
        return None


def _collect_sglang(base: str, section: Dict[str, Any]) -> None:
    for path in ("/server_info", "/get_server_info"):
        body = _get(base + path)
        if body is None:
            continue
        try:
            info = json.loads(body.decode("utf-8", "replace"))
        except ValueError:
            continue
        if isinstance(info, dict):
            section["server_info"] = redact_mapping(info)
            section["status"] = "ok"
            break
    body = _get(base + "/metrics")
    if body is not None:
        section["metrics"] = parse_metrics(body.decode("utf-8", "replace"))
        if section["metrics"]:
            section["status"] = "ok"


def _collect_vllm(base: str, section: Dict[str, Any]) -> bool:
    """Fill the section from vLLM's /metrics; whether anything answered there."""
    body = _get(base + "/metrics")
    if body is None:
        return False
    section["metrics"], section["cache_config"] = parse_vllm_metrics(whole_lines(body))
    if section["metrics"] or section["cache_config"] is not None:
        section["status"] = "ok"
    else:
        section["problems"].append({
            "code": "engine_http.no_engine_metrics",
            "message": "{}/metrics answered without vLLM's engine metrics (they are not registered when vLLM "
                       "runs with --disable-log-stats)".format(base)})
    return True


def collect(server_args: Dict[str, Any], engine: str = "sglang") -> Dict[str, Any]:
    """The engine_http section for an SGLang (``engine="sglang"``) or vLLM (``"vllm"``) server."""
    if engine not in DEFAULT_PORTS:
        raise ValueError("engine_http knows sglang and vllm, not {!r}".format(engine))
    section: Dict[str, Any] = {"status": "absent", "url": None, "server_info": None, "metrics": {},
                               "cache_config": None, "problems": []}
    host = server_args.get("host")
    if host not in LOOPBACK_HOSTS and not str(host).startswith("127."):
        section["problems"].append({"code": "engine_http.not_loopback",
                                    "message": "the server listens on {}; only loopback is queried".format(host)})
        return section
    port = server_args.get("port", DEFAULT_PORTS[engine])
    if not isinstance(port, int) or not 0 < port < 65536:
        return section
    base = "http://127.0.0.1:{}".format(port)
    section["url"] = base
    answered = False
    if engine == "vllm":
        answered = _collect_vllm(base, section)
    else:
        _collect_sglang(base, section)
    if section["status"] == "absent" and not answered:
        section["problems"].append({"code": "engine_http.unreachable",
                                    "message": "no answer from {} within {} s".format(base, TIMEOUT_S)})
    return section
