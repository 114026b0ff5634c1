"""vLLM's own HTTP view: no server-info endpoint; its OpenAI API server always serves ``/metrics``,
where the engine's gauges appear unless it runs with ``--disable-log-stats``, and
``vllm:cache_config_info`` carries the KV-cache configuration in its labels. vLLM labels its samples
per engine (data parallel ranks, ``engine="0"``...): collectors/vllm/metrics.py sums the request
counts and preemptions over them and keeps the worst cache usage."""

from __future__ import annotations

from typing import Any, Dict

from kvforensics.collectors import loopback
from kvforensics.collectors.vllm import metrics


def read_http(base: str, section: Dict[str, Any]) -> bool:
    """Fill engine_http's section from /metrics; whether anything answered there."""
    body = loopback.get(base + "/metrics")
    if body is None:
        return False
    section["metrics"], section["cache_config"] = metrics.parse(loopback.whole_lines(body))
    if section["metrics"] or section["cache_config"] is not None:
        section["status"] = "ok"
    else:
        section["problems"].append({
            "code": "engine_http.no_engine_metrics",
            "message": "{}/metrics answered without vLLM's engine metrics (they are not registered when vLLM "
                       "runs with --disable-log-stats)".format(base)})
    return True
