"""Bytes of KV cache per token per rank, from a model's config.json (research §2.3).

MLA (DeepSeek-V2/V3, Kimi-K2/K2.5): ``(kv_lora_rank + qk_rope_head_dim) × layers × elem``,
the same on every rank (the latent is replicated, not split by TP).
MHA/GQA: ``max(1, kv_heads // attn_tp) × (head_dim + v_head_dim) × layers × elem`` — KV heads
are replicated when TP exceeds the head count.
NSA (DeepSeek-V3.2) with fp8 KV stores 656 B/layer (512 fp8 + 16 scale + 128 bf16 rope) plus
the indexer's ``index_head_dim + index_head_dim/128×4`` bytes per layer.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from kvforensics.agent.model.geometry import (
    ELEM,
    GeometryError,
    KvGeometry,
    head_dims,
    need,
    optional_dim,
    resolve_dtype,
    text_config,
)
from kvforensics.agent.sglang.era import NEWEST, Era

__all__ = ["GeometryError", "KvGeometry", "geometry", "resolve_dtype", "text_config"]



def geometry(cfg: Dict[str, Any], attn_tp: int = 1, kv_cache_dtype: Optional[str] = None,
             layers: Optional[int] = None, era: Optional[Era] = None, nsa_backend: Optional[str] = None,
             pp_size: int = 1) -> KvGeometry:
    """Per-rank KV bytes per token under the release rules of ``era`` (default: the newest).
    ``layers`` overrides the layer count (a draft); with pipeline parallelism the budget counts the
    stage's layers from 0.4.6.post5 (the largest stage binds: SGLang takes the MIN of T over stages).
    Sources: profile_max_num_token (≤0.5.6), get_cell_size_per_token (0.5.7–0.5.10),
    DefaultPoolConfigurator._compute_cell_size (0.5.11+) — sglang_source_facts §5."""
    era = era or Era(NEWEST, NEWEST, ())
    lm = text_config(cfg)
    dtype = resolve_dtype(kv_cache_dtype, cfg)
    if dtype not in ELEM:
        raise GeometryError("unknown KV cache dtype '{}'".format(dtype))
    elem = ELEM[dtype]
    n_layers = layers or need(lm, "num_hidden_layers")
    if layers is None and pp_size > 1 and era.at_least((0, 4, 7)):
        n_layers = -(-n_layers // pp_size)
    if "kv_lora_rank" in lm:
        return _mla(lm, n_layers, dtype, elem, era, nsa_backend)
    return _mha(lm, n_layers, dtype, elem, era, attn_tp)


def _mla(lm: Dict[str, Any], n_layers: int, dtype: str, elem: float, era: Era,
         nsa_backend: Optional[str]) -> KvGeometry:
    latent = need(lm, "kv_lora_rank")
    rope = need(lm, "qk_rope_head_dim")
    index_dim = lm.get("index_head_dim")
    if isinstance(index_dim, int) and index_dim > 0:
        # NSA/DSA (DeepSeek-V3.2): fp8 KV is stored as 512 fp8 + 16 scale bytes + 64 bf16 rope = 656 B per
        # layer in the budget from 0.5.17, except with the trtllm DSA backend (576 × elem before, and
        # without fp8); the indexer's uint8 keys (+ scales) are in the cell from 0.5.4.
        if elem == 1.0 and era.at_least((0, 5, 17)) and nsa_backend != "trtllm":
            per_layer, how = latent + latent // 128 * 4 + rope * 2, "({} + {}/128×4 + {}×2)".format(latent, latent,
                                                                                                    rope)
        else:
            per_layer, how = int((latent + rope) * elem), "({} + {}) × {:g} B".format(latent, rope, elem)
        indexer = index_dim + index_dim // 128 * 4 if era.at_least((0, 5, 4)) else 0
        return KvGeometry(kind="nsa", layers=n_layers, bytes_per_token=(per_layer + indexer) * n_layers, dtype=dtype,
                          formula="({}{}) × {} layers".format(how, " + indexer {}".format(indexer) if indexer else "",
                                                              n_layers))
    base = int((latent + rope) * n_layers * elem)
    if elem == 0.5:  # fp4: one scale byte per 16 values
        base += ((latent + rope) // 16) * n_layers
    return KvGeometry(kind="mla", layers=n_layers, bytes_per_token=base, dtype=dtype,
                      formula="({} + {}) × {} layers × {:g} B".format(latent, rope, n_layers, elem))


def _mha(lm: Dict[str, Any], n_layers: int, dtype: str, elem: float, era: Era, attn_tp: int) -> KvGeometry:
    kv_heads, head_dim, _ = head_dims(lm)
    # v_head_dim counts from 0.5.7; before, K and V were both head_dim wide.
    v_head_dim = optional_dim(lm, "v_head_dim", head_dim) if era.at_least((0, 5, 7)) else head_dim
    per_rank = max(1, int(kv_heads) // max(1, attn_tp))
    width = per_rank * (head_dim + v_head_dim) * n_layers
    formula = "max(1, {} KV heads // TP {}) × ({} + {}) × {} layers × {:g} B".format(
        kv_heads, attn_tp, head_dim, v_head_dim, n_layers, elem)
    if elem == 0.5:
        # fp4 (0.5.5+): packed values, one scale byte per 16 K values and 16 V values, and from 0.5.16 a
        # shared dequant workspace of one layer's K+V.
        base = width // 2 + (per_rank * head_dim * n_layers * 2) // 16
        formula += " + scales {}".format((per_rank * head_dim * n_layers * 2) // 16)
        if era.at_least((0, 5, 16)):
            base += per_rank * head_dim * 2
            formula += " + dequant workspace {}".format(per_rank * head_dim * 2)
        return KvGeometry(kind="mha", layers=n_layers, bytes_per_token=base, dtype=dtype, formula=formula)
    base = int(width * elem)
    if dtype == "mxfp8":  # 0.5.16+: one e8m0 scale per 32 values
        base += width // 32
        formula += " + scales {}".format(width // 32)
    return KvGeometry(kind="mha", layers=n_layers, bytes_per_token=base, dtype=dtype, formula=formula)


# DeepSeek-V2/V3, Kimi-K2/K2.5 MLA: kv_lora_rank 512 + qk_rope_head_dim 64 values per layer per token.
MLA_WIDTH = 512 + 64
_POOL_ELEM = (("float8", 1), ("fp8", 1), ("uint8", 1), ("bfloat16", 2), ("float16", 2))


def mla_layers_from_pool(kv_bytes: int, tokens: int, page_size: int, dtype: Optional[str],
                         tolerance_bytes: int) -> Optional[Tuple[int, int]]:
    """The layer count of an MLA pool from its own 'KV Cache is allocated. dtype: …, #tokens: N, KV size: …'
    line (0.5.13+ prints the dtype): KV size = (N + page_size) × (kv_lora_rank + rope) × elem × layers
    (MLATokenToKVPool.__init__, memory_pool.py). Only the 512 + 64 latent is tried, and only a whole layer
    count within the print rounding is accepted: an NSA pool (indexer bytes) or another width gives None.
    Returns (layers, bytes per value)."""
    elem = next((size for name, size in _POOL_ELEM if dtype and name in dtype), None)
    if elem is None or tokens <= 0:
        return None
    rows = tokens + page_size
    per_layer = MLA_WIDTH * elem * rows
    layers = int(round(kv_bytes / per_layer))
    if per_layer <= 2 * tolerance_bytes:  # a pool so small the print rounding hides a layer
        return None
    if layers < 1 or abs(kv_bytes - layers * per_layer) > tolerance_bytes:
        return None
    return layers, elem
