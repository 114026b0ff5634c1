"""``kvforensics record``: sample this node, append to the history, export a Prometheus textfile.

Meant for cron or a systemd timer on every inference node (deploy/). Each run takes
``--samples`` snapshots ``--interval`` seconds apart (catching peaks between cron runs),
stores them under the current engine run, prunes samples older than ``--keep``, and writes
the textfile once, at the end, atomically.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

from agent.history import store as history
from agent.model.live import Inspection, Owner
from agent.model.reconcile import inspect_snapshot
from agent.model.records import Options
from agent.plugin import ENGINES
from collectors.snapshot import engine_kind, selected_engine


@dataclass(frozen=True)
class RecordResult:
    inspection: Inspection
    stats: history.RunStats
    samples_written: int
    pruned: int
    moved_aside: Optional[str]
    run_min: Dict[int, int]  # gpu -> least free memory over this invocation's samples


def boot_id(root: str = "/") -> str:
    try:
        with open(os.path.join(root, "proc", "sys", "kernel", "random", "boot_id")) as f:
            return f.read().strip()
    except OSError:
        return "unknown-boot"


def run_key(snap: Dict[str, Any]) -> str:
    """One engine run = one server process lifetime: boot id + PID + process start time.

    A restart (new flags, a crash loop) is a new process, hence a new run with fresh
    low-water marks. Without an engine, samples go to a per-boot "no engine" run.
    """
    engine = selected_engine(snap)
    server = engine.get("server") if engine else None
    if server is None and engine and engine.get("schedulers"):
        server = engine["schedulers"][0]
    if server is None:
        return "no-engine:{}".format(boot_id())
    raw = "{}:{}:{}".format(boot_id(), server["pid"], server.get("start_time_s"))
    return "{}:{}".format(engine_kind(engine), hashlib.sha256(raw.encode()).hexdigest()[:16])


def _engine_row(insp: Inspection) -> Optional[Dict[str, Any]]:
    a = insp.analysis
    metrics = insp.snapshot.http.metrics
    if a is None and not metrics:
        return None

    # The engine's own gauges (its plug-in's LoadMetrics): an engine that reports usage as a share of
    # its blocks has no token count.
    model = ENGINES.find(insp.engine_kind or getattr(a, "engine", None))
    load = model.load.read(metrics) if model is not None else {}
    used, usage, running, queued = (load.get(k) for k in ("used_tokens", "kv_usage", "running", "queued"))
    return {"kv_tokens": a.summary.max_total_num_tokens if a else None,
            "used_tokens": int(used) if used is not None else None, "token_usage": usage,
            "running": int(running) if running is not None else None,
            "queued": int(queued) if queued is not None else None}


def record(db_path: str, collect: Callable[[], Dict[str, Any]], opts: Options, samples: int = 1,
           interval_s: float = 0.0, keep_s: Optional[float] = None, target: str = "local") -> RecordResult:
    """Take ``samples`` snapshots into the history. The caller holds ``history.Lock``. A history that
    cannot be written (disk full, a read-only file) is a HistoryError, one sentence; a path that is not
    our history is history.Refused and left untouched; our own damaged history is moved aside."""
    try:
        return _record(db_path, collect, opts, samples, interval_s, keep_s, target)
    except sqlite3.OperationalError as exc:
        raise history.HistoryError("{}: cannot write the history: {} (a full disk or a read-only file? "
                                   "--db PATH chooses another)".format(db_path, exc)) from None
    except history.Corrupt as exc:  # found while writing, past every check: the next run's open moves it aside
        raise exc.at(db_path) from None


def _record(db_path: str, collect: Callable[[], Dict[str, Any]], opts: Options, samples: int,
            interval_s: float, keep_s: Optional[float], target: str) -> RecordResult:
    first = collect()  # its engine run's rows are read before anything is written (open_db)
    opened = history.open_db(db_path, run_key=run_key(first))
    conn = opened.conn
    written = 0
    run_min: Dict[int, int] = {}
    insp: Optional[Inspection] = None
    run_id = -1
    try:
        for i in range(samples):
            if i:
                time.sleep(interval_s)
            snap = collect() if i else first
            insp = inspect_snapshot(snap, target, opts)
            now = time.time()
            a = insp.analysis
            key = run_key(snap)
            engine = selected_engine(snap)
            args = engine.get("server_args", {}) if engine else {}
            model = args.get("model_path") or args.get("model")
            run_id = history.upsert_run(
                conn, key, now, host=snap.get("hostname"), engine=insp.engine,
                started_at=None, version_hint=a.era.hint if a else None,
                model=str(model) if model else None,
                # SGLang's budget inputs; a vLLM run leaves them null (its fraction means another thing)
                mem_fraction_static=getattr(a.budget, "mfs", None) if a else None,
                pre_load_free_bytes=getattr(a.budget, "pre_min_bytes", None) if a else None,
                bytes_per_token=a.budget.cell_bytes if a else None)
            gpus: List[Dict[str, Any]] = []
            for g in insp.gpus:
                if g.free_bytes is not None:
                    run_min[g.index] = min(g.free_bytes, run_min.get(g.index, g.free_bytes))
                engine_used = g.held_by(Owner.ENGINE) if g.rank else None
                gpus.append({"gpu": g.index, "uuid": g.uuid, "rank": g.rank, "total_bytes": g.total_bytes,
                             "reserved_bytes": g.reserved_bytes, "used_bytes": g.used_bytes, "free_bytes": g.free_bytes,
                             "engine_used_bytes": engine_used})
            collected = not insp.collected_nothing
            history.add_sample(conn, run_id, now, collected, gpus, _engine_row(insp))
            written += 1
        pruned = history.prune(conn, time.time() - keep_s, keep_run=run_id) if keep_s else 0
        stats = history.run_stats(conn, run_id)
        assert insp is not None
        # Findings and recommendations now rest on the run's history, not only the last look.
        insp = inspect_snapshot(insp.snapshot, target, opts, history=stats)  # already typed
        return RecordResult(inspection=insp, stats=stats, samples_written=written, pruned=pruned,
                            moved_aside=opened.moved_aside, run_min=run_min)
    finally:
        conn.close()


def current_stats(db_path: str, snap: Dict[str, Any]) -> Optional[history.RunStats]:
    """The recorded history of the engine run ``snap`` belongs to, if any (read-only)."""
    if not os.path.exists(db_path):
        return None
    try:
        opened = history.open_db(db_path, create=False)
    except history.HistoryError:
        return None
    try:
        rid = history.run_id_for(opened.conn, run_key(snap))
        return history.run_stats(opened.conn, rid) if rid is not None else None
    except (history.HistoryError, sqlite3.Error):  # a damaged history is no history here; record says so
        return None
    finally:
        opened.conn.close()
