"""The engine's own HTTP view (optional): /server_info and /metrics, on loopback only.

``/server_info`` (0.5.6+; ``/get_server_info`` 0.4.0+) gives the resolved server args and
per-DP ``internal_states`` (``memory_usage``: weight/kvcache/graph GiB, token_capacity);
``/metrics`` (only with ``--enable-metrics``) gives live token usage and request counts.
Only 127.0.0.1 is ever contacted, with a short timeout: a busy server must not stall a
diagnosis, and kvforensics never talks to other hosts from the probe.

Output: ``{"status", "url", "server_info": {...}|None, "metrics": {name: value}, "problems"}``.
Metric values are summed over TP ranks for counts of requests only where SGLang reports them
per rank; gauges keep the first sample (ranks agree).
"""

from __future__ import annotations

import json
import re
from typing import Any, Dict, Optional

from collectors.redact import redact_mapping

NAME = "engine_http"
TIMEOUT_S = 0.5
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "0.0.0.0", "::1", "::", None)
WANTED = ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage", "sglang:num_used_tokens",
          "sglang:max_total_num_tokens", "sglang:kv_used_tokens", "sglang:kv_available_tokens",
          "sglang:gen_throughput", "sglang:startup_available_gpu_memory_gb", "sglang:context_len")
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_metrics(text: str) -> Dict[str, float]:
    """The first sample of each wanted metric from Prometheus text exposition."""
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


def _get(url: str) -> Optional[bytes]:
    import urllib.error  # here, not at the top: only hosts running an engine pay for it
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as resp:  # noqa: S310 - loopback only
            return resp.read(4 << 20)
    except (urllib.error.URLError, OSError, ValueError):
        return None


def collect(server_args: Dict[str, Any]) -> Dict[str, Any]:
    section: Dict[str, Any] = {"status": "absent", "url": None, "server_info": None, "metrics": {}, "problems": []}
    host = server_args.get("host")
    if host not in LOOPBACK_HOSTS and not str(host).startswith("127."):
        section["problems"].append({"code": "engine_http.not_loopback",
                                    "message": "the server listens on {}; only loopback is queried".format(host)})
        return section
    port = server_args.get("port", 30000)
    if not isinstance(port, int) or not 0 < port < 65536:
        return section
    base = "http://127.0.0.1:{}".format(port)
    section["url"] = base
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
    if section["status"] == "absent":
        section["problems"].append({"code": "engine_http.unreachable",
                                    "message": "no answer from {} within {} s".format(base, TIMEOUT_S)})
    return section
