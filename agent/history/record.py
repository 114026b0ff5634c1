"""``kvforensics record``: sample this node, append to the history, export a Prometheus textfile.

Meant for cron or a systemd timer on every inference node (deploy/). Each run takes
``--samples`` looks ``--interval`` seconds apart (catching peaks between cron runs); each look
explains every engine on the node (one ``Inspection`` per engine, ``collectors.snapshot.collect_each``)
and stores one sample under each engine's current run, prunes samples older than ``--keep``, and the
caller writes the textfile once, at the end, atomically. One history and one writer per node: the
node's own figures are sampled and exported once, whatever the number of engines.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

from kvforensics.agent.history import store as history
from kvforensics.agent.model.live import Inspection, Owner
from kvforensics.agent.model.reconcile import inspect_snapshot, with_history
from kvforensics.agent.model.records import Options
from kvforensics.agent.plugin import ENGINES
from kvforensics.collectors.snapshot import engine_kind, engine_selector, selected_engine

if TYPE_CHECKING:
    from kvforensics.collectors import selection

# An engine recorded within this window and not found now is "gone" (kvforensics_engine_up 0): long
# enough for an alert's `for:` at a 5-minute cron, short enough that a stopped engine stops counting
# (--gone-after: an operator who wants the alert to hold until someone looks sets a day or a week).
GONE_WINDOW_S = 3600.0

Labels = Tuple[Tuple[str, str], ...]


@dataclass(frozen=True)
class EngineRecord:
    """One engine's part of a record run: its last look with the run's history, and this run's minima."""

    inspection: Inspection
    stats: history.RunStats
    run_min: Dict[int, int]  # gpu -> least free memory over this invocation's samples


@dataclass(frozen=True)
class RecordResult:
    """What one ``record`` run did: the engines explained and those gone, the samples written and pruned, and
    where an unusable history was moved aside (None: it was not)."""

    engines: Tuple[EngineRecord, ...]  # one per engine explained, the primary first; one explaining none
    gone: Tuple[history.RecentRun, ...]  # engines recorded within GONE_WINDOW_S that are not found now
    last_success: Optional[float]  # the last sample that collected something, from the history
    samples_written: int  # looks at the node (each a sample per engine)
    pruned: int
    moved_aside: Optional[str]

    @property
    def primary(self) -> EngineRecord:
        return self.engines[0]

    @property
    def inspection(self) -> Inspection:
        return self.primary.inspection

    @property
    def stats(self) -> history.RunStats:
        return self.primary.stats

    @property
    def collected_nothing(self) -> bool:
        return all(e.inspection.collected_nothing for e in self.engines)


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


def engine_labels(insp: Inspection) -> Labels:
    """What names an engine in metrics: ``engine``, and its pod's labels when it runs in one."""
    if insp.engine is None:
        return ()
    pod = insp.snapshot.selected.pod if insp.snapshot.selected is not None else None
    return (("engine", insp.engine),) + (pod.labels() if pod is not None else ())


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


def record(db_path: str, collect: Callable[[], List[Dict[str, Any]]], opts: Options, samples: int = 1,
           interval_s: float = 0.0, keep_s: Optional[float] = None, target: str = "local",
           engine: Optional[str] = None, gone_after_s: float = GONE_WINDOW_S) -> RecordResult:
    """Take ``samples`` looks (``collect``: one snapshot per engine) into the history. The caller holds
    ``history.Lock``. ``engine``: the --engine asked for, whose engines' gone runs alone count; ``gone_after_s``:
    how long an engine not found counts as gone (--gone-after). A history
    that cannot be written (disk full, a read-only file) is a HistoryError, one sentence; a path that is not
    our history is history.Refused and left untouched; our own damaged history is moved aside."""
    try:
        return _record(db_path, collect, opts, samples, interval_s, keep_s, target, engine_selector(engine),
                       gone_after_s)
    except sqlite3.OperationalError as exc:
        raise history.HistoryError("{}: cannot write the history: {} (a full disk or a read-only file? "
                                   "--db PATH chooses another)".format(db_path, exc)) from None
    except history.Corrupt as exc:  # found while writing, past every check: the next run's open moves it aside
        raise exc.at(db_path) from None


def _record(db_path: str, collect: Callable[[], List[Dict[str, Any]]], opts: Options, samples: int,
            interval_s: float, keep_s: Optional[float], target: str,
            selector: Optional[selection.EngineSelector], gone_after_s: float) -> RecordResult:
    first = collect()  # its engine runs' rows are read before anything is written (open_db)
    opened = history.open_db(db_path, run_keys=[run_key(s) for s in first],
                             startup_keys=[run_key(s) for s in first if wants_kept_startup(s)])
    conn = opened.conn
    run_min: Dict[int, int] = {}
    looked: List[Tuple[Inspection, int]] = []
    try:
        for i in range(samples):
            if i:
                time.sleep(interval_s)
            looked = _look(conn, collect() if i else first, target, opts, run_min)
        keep = [rid for _, rid in looked]
        pruned = history.prune(conn, time.time() - keep_s, keep_runs=keep) if keep_s else 0
        engines = tuple(_with_history(conn, insp, rid, target, opts, run_min) for insp, rid in looked)
        return RecordResult(engines=engines, gone=_gone(conn, engines, selector, time.time(), gone_after_s),
                            last_success=history.last_success(conn), samples_written=samples, pruned=pruned,
                            moved_aside=opened.moved_aside)
    finally:
        conn.close()


def _look(conn: sqlite3.Connection, snaps: List[Dict[str, Any]], target: str, opts: Options,
          run_min: Dict[int, int]) -> List[Tuple[Inspection, int]]:
    """One look: each engine's inspection and one sample under its run. Each GPU is stored once per look:
    in the sample of the engine running on it, a GPU no engine runs on in the primary's."""
    now = time.time()
    looks = [(snap, with_kept_startup(conn, snap)) for snap in snaps]
    insps = [inspect_snapshot(used, target, opts) for _, used in looks]
    owned = {g.index for insp in insps for g in insp.engine_gpus}
    for g in insps[0].gpus:
        if g.free_bytes is not None:
            run_min[g.index] = min(g.free_bytes, run_min.get(g.index, g.free_bytes))
    out = []
    for i, ((snap, used), insp) in enumerate(zip(looks, insps)):
        run_id = _upsert(conn, run_key(snap), insp, now)
        if _from_the_log(snap, used):
            history.save_startup(conn, run_id, snap["engine_log"], now)
        rows = [_gpu_row(g) for g in insp.gpus if g.rank is not None or (i == 0 and g.index not in owned)]
        history.add_sample(conn, run_id, now, not insp.collected_nothing, rows, _engine_row(insp))
        out.append((insp, run_id))
    return out


# --- the startup of each engine run, kept --------------------------------------------------------

def _from_the_log(snap: Dict[str, Any], restored: Dict[str, Any]) -> bool:
    """The snapshot's startup was read from the engine's log now (not restored from the history)."""
    log = snap.get("engine_log") or {}
    return bool(log.get("lines")) and restored is snap and selected_engine(snap) is not None


def wants_kept_startup(snap: Dict[str, Any]) -> bool:
    """The snapshot's engine log holds no startup now: the one kept for its run stands in (with_kept_startup)."""
    log = snap.get("engine_log") or {}
    return not log.get("lines") and selected_engine(snap) is not None


def with_kept_startup(conn: sqlite3.Connection, snap: Dict[str, Any]) -> Dict[str, Any]:
    """``snap``, with the startup its engine run's log held when it no longer does (a log rotated with
    copytruncate, truncated, or a container log rotated away): the lines kept in the history for this run,
    as the snapshot's engine_log section held them. Facts read at startup (the KV pool, the budget) hold
    for the whole run; a new run (a restart) reads its own startup."""
    if not wants_kept_startup(snap):
        return snap
    log = snap.get("engine_log") or {}
    rid = history.run_id_for(conn, run_key(snap))
    kept = history.startup(conn, rid) if rid is not None else None
    if kept is None:
        return snap
    why = "; ".join(p.get("message", "") for p in log.get("problems") or ()) or "no startup lines"
    note = ("the log no longer holds this engine run's startup ({}): the startup read from {} at {} is used, "
            "kept in the history").format(why, kept.section.get("source") or "its log",
                                          time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(kept.read_at)))
    section = dict(kept.section, notes=list(kept.section.get("notes") or ()) + [note], problems=[], status="ok")
    runs = [dict(r, status="ok") if r.get("name") == "engine_log" else r for r in snap.get("collector_runs") or ()]
    return dict(snap, engine_log=section, collector_runs=runs)


def _upsert(conn: sqlite3.Connection, key: str, insp: Inspection, now: float) -> int:
    a = insp.analysis
    args = insp.engine_args or {}
    model = args.get("model_path") or args.get("model")
    pod = dict(engine_labels(insp))
    return history.upsert_run(
        conn, key, now, host=insp.snapshot.hostname, engine=insp.engine, started_at=None,
        version_hint=a.era.hint if a else None, model=str(model) if model else None,
        # SGLang's budget inputs; a vLLM run leaves them null (its fraction means another thing)
        mem_fraction_static=getattr(a.budget, "mfs", None) if a else None,
        pre_load_free_bytes=getattr(a.budget, "pre_min_bytes", None) if a else None,
        bytes_per_token=a.budget.cell_bytes if a else None,
        port=insp.snapshot.selected.port if insp.snapshot.selected is not None else None,
        namespace=pod.get("namespace"), pod=pod.get("pod"), container=pod.get("container"))


def _gpu_row(g: Any) -> Dict[str, Any]:
    engine_used = g.held_by(Owner.ENGINE) if g.rank else None
    return {"gpu": g.index, "uuid": g.uuid, "rank": g.rank, "total_bytes": g.total_bytes,
            "reserved_bytes": g.reserved_bytes, "used_bytes": g.used_bytes, "free_bytes": g.free_bytes,
            "engine_used_bytes": engine_used, "pci_bus_id": g.pci_bus_id, "name": g.name}


def _with_history(conn: sqlite3.Connection, insp: Inspection, run_id: int, target: str, opts: Options,
                  run_min: Dict[int, int]) -> EngineRecord:
    """Findings and recommendations now rest on the run's history, not only the last look."""
    stats = history.run_stats(conn, run_id)
    insp = with_history(insp, stats)
    return EngineRecord(inspection=insp, stats=stats, run_min=run_min)


def _gone(conn: sqlite3.Connection, engines: Sequence[EngineRecord], selector: Optional[selection.EngineSelector],
          now: float, window_s: float = GONE_WINDOW_S) -> Tuple[history.RecentRun, ...]:
    """Engines recorded within ``window_s`` that no engine found now stands for (same labels), one per
    labels, the last seen; with --engine, only those it names. A pod's engine replaced by a pod of the same
    namespace, container and engine that started after it was last seen (a rolling update) is not gone."""
    current = {e.stats.run_key for e in engines}
    found = {engine_labels(e.inspection) for e in engines}
    gone: Dict[Labels, history.RecentRun] = {}
    for r in history.recent_runs(conn, now - window_s):
        labels = (("engine", r.engine),) + r.pod
        if r.run_key in current or labels in found or (selector is not None and not selector.names(r.port, _pod(r))):
            continue
        if not any(_replaces(e, r) for e in engines):
            gone[labels] = r  # ordered by last_seen: the last one seen wins
    return tuple(gone.values())


def _pod(r: history.RecentRun) -> Optional[Tuple[str, str]]:
    pod = dict(r.pod)
    return (pod["namespace"], pod["pod"]) if "namespace" in pod and "pod" in pod else None


def _replaces(e: EngineRecord, r: history.RecentRun) -> bool:
    mine = dict(engine_labels(e.inspection))
    theirs = dict(r.pod, engine=r.engine)
    if "pod" not in theirs or mine.get("pod") == theirs["pod"]:
        return False
    same = all(mine.get(k) == theirs.get(k) for k in ("engine", "namespace", "container"))
    return same and e.stats.first_seen >= r.last_seen


def local_history(db_path: str, snap: Dict[str, Any]) -> Tuple[Dict[str, Any], Optional[history.RunStats]]:
    """``with_kept_startup``, and the recorded history of the engine run what it gives belongs to, over one
    opening of the history, read-only (inspect on the node: each opening checks the file, quick_check
    included, which grows with the history). ``snap`` and None when there is no history, it is not ours, or
    it is damaged (a damaged history is no history here; record says so)."""
    if not os.path.exists(db_path):
        return snap, None
    try:
        opened = history.open_db(db_path, create=False)
    except history.HistoryError:
        return snap, None
    try:
        looked = with_kept_startup(opened.conn, snap)
        rid = history.run_id_for(opened.conn, run_key(looked))
        return looked, history.run_stats(opened.conn, rid) if rid is not None else None
    except (history.HistoryError, sqlite3.Error):
        return snap, None
    finally:
        opened.conn.close()
