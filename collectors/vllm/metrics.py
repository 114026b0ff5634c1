"""vLLM's /metrics page: the load and KV-cache figures kvforensics reads, and the cache configuration
``vllm:cache_config_info`` carries in its labels.
"""

from __future__ import annotations

import math
import re
from typing import Any, Dict, Optional, Tuple

from kvforensics.collectors.exposition import FLOAT, iter_samples
from kvforensics.collectors.redact import redact_mapping

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

_INT = re.compile(r"[+-]?[0-9]+\Z")


def config_value(text: str) -> Any:
    """A cache_config label value as JSON: int or float where it parses and is sane, None for
    Python's "None" and for absurd or non-finite numbers, else the string (cut to 64 chars)."""
    if _INT.match(text):
        number: float = int(text)
    elif FLOAT.match(text):
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


def parse(text: str) -> Tuple[Dict[str, float], Optional[Dict[str, Any]]]:
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
    # two finite samples can sum past float range: an infinite figure is not JSON, and no figure at all
    return {k: v for k, v in metrics.items() if math.isfinite(v)}, config
