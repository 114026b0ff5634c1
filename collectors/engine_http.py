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
from typing import Any, Dict, Optional

from collectors.engines import KINDS, default_port
from collectors.exposition import iter_samples
from collectors.redact import redact_mapping
from collectors.vllm import metrics as vllm_metrics

NAME = "engine_http"
TIMEOUT_S = 0.5
READ_LIMIT = 4 << 20
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "0.0.0.0", "::1", "::", None)
WANTED = ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage", "sglang:num_used_tokens",
          "sglang:max_total_num_tokens", "sglang:kv_used_tokens", "sglang:kv_available_tokens",
          "sglang:gen_throughput", "sglang:startup_available_gpu_memory_gb", "sglang:context_len")


def parse_metrics(text: str) -> Dict[str, float]:
    """The first sample of each wanted metric from Prometheus text exposition (SGLang; its ranks agree)."""
    out: Dict[str, float] = {}
    for name, _, value in iter_samples(text, WANTED):
        out.setdefault(name, value)
    return out


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
        section["metrics"] = parse_metrics(whole_lines(body))
        if section["metrics"]:
            section["status"] = "ok"


def _collect_vllm(base: str, section: Dict[str, Any]) -> bool:
    """Fill the section from vLLM's /metrics; whether anything answered there."""
    body = _get(base + "/metrics")
    if body is None:
        return False
    section["metrics"], section["cache_config"] = vllm_metrics.parse(whole_lines(body))
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
    if engine not in KINDS:
        raise ValueError("engine_http knows sglang and vllm, not {!r}".format(engine))
    section: Dict[str, Any] = {"status": "absent", "url": None, "server_info": None, "metrics": {},
                               "cache_config": None, "problems": []}
    host = server_args.get("host")
    if host not in LOOPBACK_HOSTS and not str(host).startswith("127."):
        section["problems"].append({"code": "engine_http.not_loopback",
                                    "message": "the server listens on {}; only loopback is queried".format(host)})
        return section
    port = server_args.get("port", default_port(engine))
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
