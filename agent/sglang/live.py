"""SGLang on a live node: which GPU process is which rank, and what its log says that rank holds.

Each scheduler process is one rank, named by its title (``sglang::scheduler_TP3`` → ``TP3``); the
log's per-rank ledger (``agent/sglang/ledger.py``) gives the items NVML's figure splits into.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from kvforensics.agent.model.live import ItemKind, LedgerItem
from kvforensics.agent.sglang.analysis import Analysis
from kvforensics.agent.sglang.ledger import RankLedger

if TYPE_CHECKING:
    from kvforensics.agent.model.evidence import Engine


def _rank_ledger(analysis: Optional[Analysis], rank: str) -> Optional[RankLedger]:
    if analysis is None:
        return None
    return next((r for r in analysis.ranks if r.rank == rank), None)


def logged_items(led: Optional[RankLedger]) -> List[LedgerItem]:
    """What the engine's log says its process on this GPU holds (items the log gives)."""
    if led is None:
        return []
    t, d = led.target, led.draft
    logged = [LedgerItem(ItemKind.WEIGHTS, t.weights_bytes, t.sources.get("weights_bytes", "")),
              LedgerItem(ItemKind.KV_POOL, t.kv_bytes, t.sources.get("kv_bytes", "")),
              LedgerItem(ItemKind.MAMBA, t.mamba_bytes, t.sources.get("mamba_bytes", "")),
              LedgerItem(ItemKind.GRAPHS, t.graph_bytes, t.sources.get("graph_bytes", "")),
              LedgerItem(ItemKind.WORKSPACES, (t.workspace_bytes or 0) + (led.req_to_token_bytes or 0) or None,
                         "log gap before capture + formula"),
              LedgerItem(ItemKind.DRAFT, d.total_bytes if d else None, "draft weights + KV + graphs from the log")]
    return [x for x in logged if x.bytes]


def place(engine: Engine, analysis: Optional[Analysis],
          gpu_of: Dict[int, int]) -> Dict[int, Tuple[str, List[LedgerItem]]]:
    """PID → (rank, the log's items for that rank) for every scheduler process (its title names the rank;
    ``gpu_of``, PID → GPU index, is what other engines need)."""
    return {p.pid: (rank, logged_items(_rank_ledger(analysis, rank))) for p, rank in engine.workers}
