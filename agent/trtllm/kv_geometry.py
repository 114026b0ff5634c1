"""Bytes of KV cache per token per rank, from a model's config.json, as TensorRT-LLM sizes it (the PyTorch backend's
``get_cache_size_per_token``, tensorrt_llm/_torch/pyexecutor/_util.py / resource_manager.py; the C++
``calculateCacheSizePerToken``, batch_manager/kvCacheManager.cpp):

* full attention: ``max(1, kv_heads // tp) × head_dim × 2 (K, V) × ceil(layers / pp) × dtype bytes``;
* MLA (DeepSeek-V3, Kimi-K2): one latent of ``kv_lora_rank + qk_rope_head_dim`` per layer, no ×2, no TP split.

Used to tell a 16-bit KV cache from an 8-bit one: the log prints bytes per token, not the dtype.
"""

from __future__ import annotations

from typing import Any, Dict, Tuple

from kvforensics.agent.model import geometry as mg
from kvforensics.agent.model.geometry import GeometryError

__all__ = ["GeometryError", "bytes_per_token"]


def bytes_per_token(cfg: Dict[str, Any], element_bytes: int, tp: int = 1, pp: int = 1) -> Tuple[int, str]:
    """(bytes per token per rank at ``element_bytes`` a value, the arithmetic with the config's numbers)."""
    lm = mg.text_config(cfg)
    layers = -(-mg.need(lm, "num_hidden_layers") // max(1, pp))
    if "kv_lora_rank" in lm:
        latent = mg.need(lm, "kv_lora_rank") + mg.need(lm, "qk_rope_head_dim")
        return latent * layers * element_bytes, "({} + {}) × {} layers × {} B".format(
            lm["kv_lora_rank"], lm["qk_rope_head_dim"], layers, element_bytes)
    kv_heads, head_dim, _ = mg.head_dims(lm)
    per_rank = max(1, kv_heads // max(1, tp))
    return per_rank * head_dim * 2 * layers * element_bytes, "max(1, {} KV heads // TP {}) × {} × 2 (K, V) × {} " \
        "layers × {} B".format(kv_heads, tp, head_dim, layers, element_bytes)
