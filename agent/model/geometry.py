"""What a model's config.json says about its KV cache, engine-neutral: the language model's part of
the config, the KV dtype 'auto' stands for, element sizes, and the record a per-engine formula fills.

Each engine turns these into bytes per token its own way (``agent/sglang/kv_geometry.py``,
``agent/vllm/kv_geometry.py``): the formulas differ by engine and release, the inputs do not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional

# torch element sizes for a KV cache dtype (fp4 packs two values per byte; scales are the engine's)
ELEM = {"bf16": 2.0, "bfloat16": 2.0, "float16": 2.0, "fp16": 2.0, "half": 2.0, "auto": 2.0,
        "fp8": 1.0, "fp8_e4m3": 1.0, "fp8_e5m2": 1.0, "fp8_inc": 1.0, "mxfp8": 1.0, "float8_e4m3fn": 1.0,
        "float8_e5m2": 1.0, "fp4_e2m1": 0.5, "nvfp4": 0.5, "fp4_mx_block16": 0.5, "float32": 4.0}


class GeometryError(ValueError):
    """The config lacks what the formula needs; the message names the missing key."""


@dataclass(frozen=True)
class KvGeometry:
    """What an engine's formula makes of config.json: attention kind, layers, KV dtype and bytes per token, with the
    arithmetic shown."""

    kind: str  # "mla" | "nsa" | "mha"
    layers: int
    bytes_per_token: int
    dtype: str
    formula: str  # the arithmetic, with the config's numbers, for the report


def text_config(cfg: Dict[str, Any]) -> Dict[str, Any]:
    """Multimodal checkpoints (Kimi-K2.5, Llama-4, Gemma-3) nest the LM under text_config."""
    inner = cfg.get("text_config") or cfg.get("language_config") or cfg.get("llm_config")
    return inner if isinstance(inner, dict) else cfg


def resolve_dtype(kv_cache_dtype: Optional[str], cfg: Dict[str, Any], checkpoint_kv: bool = True) -> str:
    """What 'auto' means: the checkpoint's KV quantisation if FP8 (unless ``checkpoint_kv`` is False: an
    engine release that ignores it), else its torch dtype."""
    name = (kv_cache_dtype if isinstance(kv_cache_dtype, str) and kv_cache_dtype else "auto").replace("torch.", "")
    if name != "auto":
        return name
    lm = text_config(cfg)
    quant = cfg.get("quantization_config") or lm.get("quantization_config") or {}
    if checkpoint_kv and isinstance(quant, dict) and str(quant.get("kv_cache_quant_algo", "")).upper() == "FP8":
        return "fp8_e4m3"
    dtype = str(lm.get("torch_dtype") or cfg.get("torch_dtype") or lm.get("dtype") or "bfloat16")
    return dtype.replace("torch.", "")


MAX_DIM = 1 << 20  # no real layer count, head count or head size comes near this


def need(cfg: Dict[str, Any], key: str) -> int:
    value = cfg.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_DIM:
        raise GeometryError("config.json has no plausible positive integer '{}'".format(key))
    return value


def optional_dim(cfg: Dict[str, Any], key: str, default: int) -> int:
    """An optional size (head_dim, v_head_dim, num_key_value_heads): the default when absent."""
    return need(cfg, key) if cfg.get(key) is not None else default


def head_dims(lm: Dict[str, Any]) -> tuple:
    """(KV heads, K head size, attention heads) of a multi-head / grouped-query attention config."""
    heads = need(lm, "num_attention_heads")
    kv_heads = optional_dim(lm, "num_key_value_heads", heads)
    head_dim = lm.get("head_dim") and need(lm, "head_dim") or max(1, need(lm, "hidden_size") // heads)
    return kv_heads, head_dim, heads
