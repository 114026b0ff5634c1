"""vLLM, as the renderers see it: the one object the engine-neutral reports read."""

from __future__ import annotations

from typing import Any, Iterable, Tuple

from kvforensics.agent.model.kinds import ItemKind
from kvforensics.collectors.registry import lazy
from kvforensics.reports.plugin import EngineView
from kvforensics.reports.vllm import json_report


def kv_pool_by_rank(insp: Any) -> Iterable[Tuple[str, int]]:
    """Each placed worker's KV cache, labelled by the GPU's rank: stable across restarts (no PID in it)."""
    for g in insp.engine_gpus:
        kv = next((x.bytes for x in g.items if x.kind is ItemKind.KV_POOL), None)
        if kv is not None and g.rank:
            yield g.rank, kv


# The renderers are imported when a format draws them (analyze --json never does).
ENGINE = EngineView(name="vllm", terminal=lazy("kvforensics.reports.vllm.terminal:render"),
                    json_target=json_report.target_dict,
                    kv_pool_by_rank=kv_pool_by_rank, brief=lazy("kvforensics.reports.vllm.terminal:brief"))
