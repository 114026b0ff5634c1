"""The model's modules on their own records: no files, no CLI, no machine.

Budget, era, ledger and attribution, the rule book (offline and live, one figure for the finding
and the metric), reconciliation, and the architecture's import graph (no cycles).
"""

from __future__ import annotations

from dataclasses import replace

from kvforensics.agent.history.store import GpuLowWater, RunStats
from kvforensics.agent.model import evidence, node_rules, rulebook
from kvforensics.agent.model.live import Owner
from kvforensics.agent.model.reconcile import reconcile
from kvforensics.agent.model.records import Options
from kvforensics.agent.sglang import budget
from kvforensics.agent.sglang.attribution import attribute
from kvforensics.agent.sglang.era import Era, detect
from kvforensics.agent.sglang.ledger import RankLedger, RunnerLedger, runner_ledger
from kvforensics.collectors.sglang.log import parse_lines
from kvforensics.collectors.sglang.startups import segment_lines
from tests.conftest import GIB

V = (0, 5, 8)


def _rank(pre: float, post: float, tokens: int, kv: int) -> RankLedger:
    target = RunnerLedger(pre_load_avail_bytes=int(pre * GIB), post_load_avail_bytes=int(post * GIB),
                          kv_tokens=tokens, kv_bytes=kv)
    return RankLedger("TP0", target, None, None, None, None, None)


def test_budget_predicts_sglangs_count_from_records():
    cell = 131072
    tokens = int(30.4 * GIB) // cell
    inputs = budget.Inputs({"mem_fraction_static": 0.88}, (_rank(80.0, 40.0, tokens, (tokens + 1) * cell),), 1)
    b = budget.compute(Era(V, V, ()), inputs)
    assert (b.predicted_tokens, b.verdict, b.cell_bytes) == (tokens, "agrees", cell)
    assert b.reserve_bytes == round(80 * GIB * 0.12)


def test_budget_without_a_fraction_back_solves_it():
    cell = 131072
    tokens = int(30.4 * GIB) // cell
    b = budget.compute(Era(V, V, ()), budget.Inputs({}, (_rank(80.0, 40.0, tokens, (tokens + 1) * cell),), 1))
    assert b.verdict == "back-solved" and abs(b.mfs - 0.88) < 0.001


def test_era_split_at_rule_boundaries():
    assert [e.hint for e in budget.split(Era((0, 5, 6), (0, 5, 8), ()))] == ["0.5.6", "0.5.7–0.5.8"]
    assert [e.hint for e in budget.split(Era((0, 5, 8), (0, 5, 8), ()))] == ["0.5.8"]


def test_era_from_line_shapes():
    (startup,) = segment_lines([(1, 0, "[2026-01-01 10:00:00 TP0] Init torch distributed ends. elapsed=1.00 s, "
                                        "mem usage=0.50 GB"),
                                (2, 0, "[2026-01-01 10:00:00 TP0] KV Cache is allocated. dtype: torch.bfloat16, "
                                        "#tokens: 10, KV size: 1.00 GB")])
    era = detect(startup)
    assert (era.low, era.high) == ((0, 5, 13), (0, 5, 20))


def test_ledger_and_attribution_from_events():
    d = "[2025-06-24 10:00:00 TP0] "
    events = parse_lines(["[2025-06-24 10:00:00] server_args=ServerArgs(speculative_algorithm='EAGLE')",
                          d + "Load weight begin. avail mem=80.00 GB",
                          d + "Load weight end. type=L, dtype=x, avail mem=40.00 GB, mem usage=39.00 GB.",
                          d + "Load weight begin. avail mem=10.00 GB",
                          d + "Load weight end. type=LEagle, dtype=x, avail mem=9.00 GB, mem usage=1.00 GB."])
    (startup,) = segment_lines([(i + 1, 0, e.raw) for i, e in enumerate(events)])
    (rank,) = attribute(startup).ranks
    assert rank.has_draft
    t = runner_ledger(rank.target, 1)
    assert (t.pre_load_avail_bytes, t.weights_bytes) == (80 * GIB, 39 * GIB)
    assert runner_ledger(rank.draft, 1).weights_bytes == GIB


def _snapshot(free_gib: float) -> evidence.Snapshot:
    gpu = {"index": 0, "status": "ok", "uuid": "GPU-0", "total_bytes": 80 * GIB, "reserved_bytes": GIB,
           "used_bytes": 79 * GIB - int(free_gib * GIB), "free_bytes": int(free_gib * GIB),
           "processes": [{"pid": 11, "used_bytes": 60 * GIB}, {"pid": 99, "used_bytes": 2 * GIB}]}
    return evidence.parse({
        "schema": "kvforensics.snapshot/1", "hostname": "n", "nvml": {"status": "ok", "gpus": [gpu]},
        "host_memory": {"status": "ok"},
        "engines": {"engines": [{"server": {"pid": 10, "cmdline": ["python"]},
                                 "schedulers": [{"pid": 11, "rank": "TP0", "cmdline": ["sglang::scheduler_TP0"]}],
                                 "helpers": [], "server_args": {"port": 30000}}], "selected": 0},
        "gpu_processes": {"processes": {"11": {"pid": 11, "cmdline": ["sglang::scheduler_TP0"]},
                                        "99": {"pid": 99, "missing": True}}}})


def test_reconcile_splits_every_gpu_byte_by_owner():
    insp = reconcile(_snapshot(10.0), "t", Options())
    (g,) = insp.gpus
    assert {p.pid: p.owner for p in g.processes} == {11: Owner.ENGINE, 99: Owner.ORPHANED}
    assert sum(i.bytes or 0 for i in g.items) == g.used_bytes + g.reserved_bytes + g.free_bytes
    assert g.rank == "TP0" and insp.engine == "sglang-30000"


def test_one_unused_figure_for_the_finding_and_the_metric():
    insp = reconcile(_snapshot(10.0), "t", Options())
    ctx = rulebook.Context.on_node(insp)
    (found,) = [f for f in rulebook.findings(ctx) if f.code == "unused_gpu_memory"]
    assert found.bytes == node_rules.unused_bytes(ctx) == 8 * GIB  # 10 GiB free − the 2 GiB margin
    # With recorded history the run's low-water mark rules both, not the look now.
    low = RunStats(1, "k", "sglang-30000", None, 0.0, 3600.0, 5,
                   (GpuLowWater(0, "GPU-0", "TP0", 5, 3 * GIB, 10 * GIB, 10 * GIB, 10.0),), None, None, None)
    ctx = rulebook.Context.on_node(replace(insp, history=low))
    (found,) = [f for f in rulebook.findings(ctx) if f.code == "unused_gpu_memory"]
    assert found.bytes == node_rules.unused_bytes(ctx) == GIB
    assert "measured over 60 minutes, 5 samples" in found.detail


def test_live_rules_see_orphans_and_never_an_offline_verdict():
    ctx = rulebook.Context.on_node(reconcile(_snapshot(10.0), "t", Options()))
    codes = [f.code for f in rulebook.findings(ctx)]
    assert "orphaned_gpu_memory" in codes and "engine_log_missing" in codes
    assert "incomplete_startup" not in codes  # no log at all: nothing to call a fragment
