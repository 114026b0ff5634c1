"""Bytes of KV cache per token per worker, from a model's config.json, as vLLM pages it (research
vllm §4.1, read in the wheels' ``vllm/v1/kv_cache_interface.py`` AttentionSpec / MLAAttentionSpec and
V0 ``vllm/worker/cache_engine.py`` get_cache_block_size):

* full attention: ``max(1, kv_heads // tp) × (head_size + head_size_v) × layers × dtype`` — heads
  replicate once TP exceeds them (``config/model.py`` get_num_kv_heads);
* MLA (DeepSeek-V2/V3, Kimi-K2): one latent of ``kv_lora_rank + qk_rope_head_dim`` per layer, no ×2
  and no TP split (every rank holds it whole);
* with pipeline parallelism a worker holds its stage's layers: ``ceil(layers / pp)``.
Sliding-window, linear-attention and mamba layers are paged by group, per request rather than per
token: such a hybrid config is not reduced to one figure (GeometryError says so).
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from kvforensics.agent.model import geometry as mg
from kvforensics.agent.model.geometry import GeometryError, KvGeometry

_FP8_PER_TOKEN_HEAD = ("int8_per_token_head", "fp8_per_token_head")  # + fp32 scales: not modelled here


def _hybrid(lm: Dict[str, Any]) -> Optional[str]:
    kinds = lm.get("layer_types")
    if isinstance(kinds, list) and any(k != "full_attention" for k in kinds):
        return "layer_types {}".format(sorted({str(k) for k in kinds})[:4])
    if lm.get("sliding_window") and lm.get("use_sliding_window", True) is not False:
        return "sliding_window {}".format(lm.get("sliding_window"))
    for key in ("linear_attn_config", "mamba_d_state", "ssm_state_size", "full_attention_interval"):
        if key in lm:
            return key
    return None


def _dtype(cfg: Dict[str, Any], kv_cache_dtype: Optional[str], reads_checkpoint_kv: Optional[bool]) -> str:
    """What 'auto' stores: from 0.14 a checkpoint's FP8 KV setting (ModelOpt kv_cache_quant_algo;
    arg_utils resolve_kv_cache_dtype_string), before that the model's dtype (0.11 gpu_model_runner)."""
    auto = not isinstance(kv_cache_dtype, str) or kv_cache_dtype in ("", "auto")
    with_checkpoint = mg.resolve_dtype(kv_cache_dtype, cfg)
    if not auto or reads_checkpoint_kv:
        return with_checkpoint
    without = mg.resolve_dtype(kv_cache_dtype, cfg, checkpoint_kv=False)
    if reads_checkpoint_kv is None and without != with_checkpoint:
        raise GeometryError("the checkpoint asks for an FP8 KV cache, which vLLM honours only from 0.14; the log "
                            "does not say which side of 0.14 this release is")
    return without


def geometry(cfg: Dict[str, Any], tp: int = 1, kv_cache_dtype: Optional[str] = None, pp: int = 1,
             reads_checkpoint_kv: Optional[bool] = True) -> KvGeometry:
    """``reads_checkpoint_kv``: the release is 0.14+ (True), older (False) or unknown (None)."""
    lm = mg.text_config(cfg)
    dtype = _dtype(cfg, kv_cache_dtype, reads_checkpoint_kv)
    if dtype not in mg.ELEM or dtype in _FP8_PER_TOKEN_HEAD or mg.ELEM[dtype] < 1:
        raise GeometryError("KV cache dtype '{}' is not modelled here (packed or per-head scales)".format(dtype))
    hybrid = _hybrid(lm)
    if hybrid is not None:
        raise GeometryError("a hybrid model ({}): vLLM pages each layer group apart".format(hybrid))
    elem = mg.ELEM[dtype]
    layers = -(-mg.need(lm, "num_hidden_layers") // max(1, pp))
    if "kv_lora_rank" in lm:
        latent = mg.need(lm, "kv_lora_rank") + mg.need(lm, "qk_rope_head_dim")
        return KvGeometry(kind="mla", layers=layers, bytes_per_token=int(latent * layers * elem), dtype=dtype,
                          formula="({} + {}) × {} layers × {:g} B".format(lm["kv_lora_rank"], lm["qk_rope_head_dim"],
                                                                          layers, elem))
    kv_heads, head_k, _ = mg.head_dims(lm)
    head_v = mg.optional_dim(lm, "v_head_dim", head_k)
    per_rank = max(1, kv_heads // max(1, tp))
    return KvGeometry(kind="mha", layers=layers, bytes_per_token=int(per_rank * (head_k + head_v) * layers * elem),
                      dtype=dtype, formula="max(1, {} KV heads // TP {}) × ({} + {}) × {} layers × {:g} B".format(
                          kv_heads, tp, head_k, head_v, layers, elem))
