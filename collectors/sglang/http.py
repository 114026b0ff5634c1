"""SGLang's own HTTP view: ``/server_info`` (0.5.6+; ``/get_server_info`` 0.4.0+) gives the resolved
server args and per-DP ``internal_states`` (``memory_usage``: weight/kvcache/graph GiB,
token_capacity); ``/metrics`` (only with ``--enable-metrics``) gives live token usage and request
counts. Metrics keep the first sample (ranks agree)."""

from __future__ import annotations

import json
from typing import Any, Dict

from kvforensics.collectors import loopback
from kvforensics.collectors.exposition import iter_samples
from kvforensics.collectors.redact import redact_mapping

WANTED = ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage", "sglang:num_used_tokens",
          "sglang:max_total_num_tokens", "sglang:kv_used_tokens", "sglang:kv_available_tokens",
          "sglang:gen_throughput", "sglang:startup_available_gpu_memory_gb", "sglang:context_len")


def parse_metrics(text: str) -> Dict[str, float]:
    """The first sample of each wanted metric from Prometheus text exposition (its ranks agree)."""
    out: Dict[str, float] = {}
    for name, _, value in iter_samples(text, WANTED):
        out.setdefault(name, value)
    return out


def read_http(base: str, section: Dict[str, Any]) -> bool:
    """Fill engine_http's section; whether anything answered (a status "ok" says so here)."""
    for path in ("/server_info", "/get_server_info"):
        body = loopback.get(base + path)
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
    body = loopback.get(base + "/metrics")
    if body is not None:
        section["metrics"] = parse_metrics(loopback.whole_lines(body))
        if section["metrics"]:
            section["status"] = "ok"
    return False
