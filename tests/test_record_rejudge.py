"""record judges each engine twice: after its sample (one look) and with the engine run's history. The second
time reuses the ledger and the startup's analysis (reconcile.with_history), which the history does not change:
it must give exactly what inspecting the snapshot afresh with that history gives."""

from __future__ import annotations

import json

from kvforensics.agent.history.store import GpuLowWater, RunStats
from kvforensics.agent.model.reconcile import inspect_snapshot, with_history
from kvforensics.agent.model.records import Options
from tests.conftest import ROOT

GIB = 1 << 30


def _stats(insp) -> RunStats:
    """Two days of samples whose low-water mark is 3 GiB below the free memory now."""
    gpus = tuple(GpuLowWater(gpu=g.index, uuid=g.uuid, rank=g.rank, samples=576,
                             min_free_bytes=g.free_bytes - 3 * GIB, max_free_bytes=g.free_bytes,
                             last_free_bytes=g.free_bytes, min_free_at=1.7e9 + 3600, pci_bus_id=g.pci_bus_id,
                             name=g.name) for g in insp.gpus)
    return RunStats(run_id=1, run_key="sglang:0123456789abcdef", engine=insp.engine, model=None, first_seen=1.7e9,
                    last_seen=1.7e9 + 2 * 86400, samples=576, gpus=gpus, peak_used_tokens=150000,
                    peak_token_usage=0.94, kv_tokens=159277)


def test_rejudging_with_history_is_inspecting_afresh_with_it():
    for name in ("seed-node.json", "vllm-node.json"):
        snap = json.loads((ROOT / "examples" / name).read_text(encoding="utf-8"))
        first = inspect_snapshot(snap, "local:node", Options())
        stats = _stats(first)
        again = with_history(first, stats)
        assert again == inspect_snapshot(first.snapshot, "local:node", Options(), history=stats), name
        assert again.history is stats
        # the history does change the judgement: the comparison is not between two copies of the first look
        assert (again.findings, again.recommendations) != (first.findings, first.recommendations), name
