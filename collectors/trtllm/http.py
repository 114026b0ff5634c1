"""TensorRT-LLM's own HTTP view (trtllm-serve, tensorrt_llm/serve/openai_server.py):

* ``/prometheus/metrics``: Prometheus text, ``trtllm_*`` names, mounted only with ``return_perf_metrics: true``
  (tensorrt_llm/metrics/collector.py): requests running and waiting, KV blocks and their utilization;
* ``/metrics``: JSON, a list of iteration-stats objects drained since the last call (empty under the PyTorch
  backend unless ``enable_iter_perf_stats: true``), each with ``numActiveRequests``, ``numQueuedRequests`` and
  ``kvCacheStats`` (``maxNumBlocks``, ``freeNumBlocks``, ``usedNumBlocks``, ``tokensPerBlock``).

Either is read into the same ``trtllm_*`` names: the one the server serves. Triton serves its own metrics on
another port (8002), not read here.
"""

from __future__ import annotations

import json
import math
from typing import Any, Dict, Optional

from kvforensics.collectors import loopback
from kvforensics.collectors.exposition import iter_samples

NAMES = ("trtllm_num_requests_running", "trtllm_num_requests_waiting", "trtllm_kv_cache_utilization",
         "trtllm_kv_cache_max_blocks", "trtllm_kv_cache_free_blocks", "trtllm_kv_cache_used_blocks",
         "trtllm_kv_cache_tokens_per_block", "trtllm_kv_cache_hit_rate")
_SUMMED = ("trtllm_num_requests_running", "trtllm_num_requests_waiting")
MAX_FIGURE = 1e15


def prometheus(text: str) -> Dict[str, float]:
    """The named samples: request counts summed over label sets (engines), every other figure the worst one."""
    out: Dict[str, float] = {}
    for name, _, value in iter_samples(text, NAMES):
        if name in _SUMMED:
            out[name] = out.get(name, 0.0) + value
        else:
            out[name] = max(value, out.get(name, value))
    return {k: v for k, v in out.items() if math.isfinite(v) and abs(v) <= MAX_FIGURE}


def _figure(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and 0 <= value <= MAX_FIGURE else None


def iteration_stats(body: str) -> Optional[Dict[str, float]]:
    """The last iteration's figures from the JSON list; None when it is not that list, {} when it is empty."""
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    if not isinstance(doc, list):
        return None
    last = next((x for x in reversed(doc) if isinstance(x, dict)), None)
    if last is None:
        return {}
    kv = last.get("kvCacheStats") if isinstance(last.get("kvCacheStats"), dict) else {}
    found = {"trtllm_num_requests_running": _figure(last.get("numActiveRequests")),
             "trtllm_num_requests_waiting": _figure(last.get("numQueuedRequests")),
             "trtllm_kv_cache_max_blocks": _figure(kv.get("maxNumBlocks")),
             "trtllm_kv_cache_free_blocks": _figure(kv.get("freeNumBlocks")),
             "trtllm_kv_cache_used_blocks": _figure(kv.get("usedNumBlocks")),
             "trtllm_kv_cache_tokens_per_block": _figure(kv.get("tokensPerBlock"))}
    used, most = found["trtllm_kv_cache_used_blocks"], found["trtllm_kv_cache_max_blocks"]
    if used is not None and most:
        found["trtllm_kv_cache_utilization"] = min(1.0, used / most)
    return {k: v for k, v in found.items() if v is not None}


def read_http(base: str, section: Dict[str, Any]) -> bool:
    """Fill engine_http's section from /prometheus/metrics, else /metrics; whether anything answered there."""
    body = loopback.get(base + "/prometheus/metrics")
    if body is not None:
        metrics = prometheus(loopback.whole_lines(body))
        if metrics:
            section["metrics"], section["status"] = metrics, "ok"
            section["metrics_path"] = "/prometheus/metrics"
            return True
    body = loopback.get(base + "/metrics")
    if body is None:
        return False
    stats = iteration_stats(loopback.whole_lines(body))
    if stats:
        section["metrics"], section["status"] = stats, "ok"
    else:
        section["problems"].append({
            "code": "engine_http.no_iteration_stats",
            "message": "{}/metrics answered without TensorRT-LLM's iteration stats (the PyTorch backend reports them "
                       "only with enable_iter_perf_stats: true, and /prometheus/metrics only with "
                       "return_perf_metrics: true)".format(base)})
    return True
