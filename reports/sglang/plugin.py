"""SGLang, as the renderers see it: the one object the engine-neutral reports read."""

from __future__ import annotations

from typing import Any, Iterable, Tuple

from kvforensics.collectors.registry import lazy
from kvforensics.reports.plugin import EngineView
from kvforensics.reports.sglang import json_report


def kv_pool_by_rank(insp: Any) -> Iterable[Tuple[str, int]]:
    """Each rank's KV pool as its startup log states it (rank labels as printed: TP0…)."""
    for r in insp.analysis.ranks:
        if r.target.kv_bytes is not None:
            yield r.rank, r.target.kv_bytes


# The renderers are imported when a format draws them (analyze --json never does).
ENGINE = EngineView(name="sglang", terminal=lazy("kvforensics.reports.sglang.terminal:render"),
                    json_target=json_report.target_dict,
                    markdown=lazy("kvforensics.reports.sglang.markdown:markdown"), kv_pool_by_rank=kv_pool_by_rank,
                    brief=lazy("kvforensics.reports.sglang.terminal:brief"))
