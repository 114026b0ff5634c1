"""TensorRT-LLM on a live node: which GPU process is which rank, and what its log says that rank holds.

Its ranks are MPI processes (the LLM API's mpi4py workers, Triton's one process per rank, or the server itself
at TP 1 in the C++ eras). Processes are taken in GPU order: the first on the lowest GPU is rank 0 (MPI
ranks map to devices in order, ``device_id = rank % gpus_per_node``). A rank's log items come from its
``[RANK n]`` lines, and the C++ runtime's untagged KV lines, which every rank prints alike (the pool is the
MIN over ranks), stand for each rank that has no tagged figure of its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from kvforensics.agent.model.live import ItemKind, LedgerItem
from kvforensics.agent.trtllm.analysis import Analysis, Rank

if TYPE_CHECKING:
    from kvforensics.agent.model.evidence import Engine


def logged_items(tagged: Optional[Rank], untagged: Optional[Rank]) -> List[LedgerItem]:
    """Weights and the KV cache as the rank's lines print them (its own first, then the shared C++ lines)."""
    def pick(field: str) -> Tuple[Optional[int], str]:
        for r in (tagged, untagged):
            if r is not None and getattr(r, field) is not None:
                return getattr(r, field), r.sources.get(field, "")
        return None, ""

    weights, weights_at = pick("weights_bytes")
    kv, kv_at = pick("kv_cache_bytes")
    items = [LedgerItem(ItemKind.WEIGHTS, weights, weights_at), LedgerItem(ItemKind.KV_POOL, kv, kv_at)]
    return [x for x in items if x.bytes]


def place(engine: "Engine", analysis: Optional[Analysis],
          gpu_of: Dict[int, int]) -> Dict[int, Tuple[str, List[LedgerItem]]]:
    """PID → ("RANK n", the log's items for it) for every engine process that holds a GPU."""
    ranks = analysis.ranks if analysis is not None else ()
    tagged = {r.rank: r for r in ranks if r.rank}
    untagged = next((r for r in ranks if not r.rank), None)
    procs = [p for p, _ in engine.workers] + ([engine.server] if engine.server is not None else [])
    on_gpu = sorted((gpu_of[p.pid], p.pid) for p in procs if p.pid in gpu_of)
    out: Dict[int, Tuple[str, List[LedgerItem]]] = {}
    for index, (_, pid) in enumerate(on_gpu):
        label = "RANK {}".format(index)
        out[pid] = (label, logged_items(tagged.get(label), untagged))
    return out
