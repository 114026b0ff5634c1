"""vLLM on a live node: which GPU process is which worker, and what its log says that worker holds.

A worker is found, in order, by the PID its log lines print (``(Worker_TP0 pid=26347)``: the log
of this very run), by its process title against the log's prefix (``VLLM::Worker_TP0`` ↔
``Worker_TP0 pid=…``, titles since 0.10.1), or, for the log's lines without a prefix (V0's driver
worker), as the server process when it holds a GPU itself, else as the one untitled engine process
on a GPU that no PID names (the engine process V0's OpenAI server spawns from 0.6.0). A worker the log does not name
keeps its title (``Worker_TP1``), else is named by its GPU (``worker GPU1``: a label that survives a
restart, never its PID), and gets no logged items: NVML's figure stands whole.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from kvforensics.agent.model.live import ItemKind, LedgerItem
from kvforensics.agent.vllm.analysis import Analysis, Worker

if TYPE_CHECKING:
    from kvforensics.agent.model.evidence import Engine

_PID = re.compile(r"\bpid=(\d+)")
DRIVER = "driver"  # V0's rank-0 worker inside the API server process: its lines carry no prefix


def _name(prefix: str) -> str:
    return prefix.split(" pid=")[0].strip()


def logged_items(w: Optional[Worker]) -> List[LedgerItem]:
    """Weights, the KV cache and the CUDA graph pool as the worker's lines print them."""
    if w is None:
        return []
    kv = w.kv_allocated_bytes if w.kv_allocated_bytes is not None else w.available_kv_bytes
    kv_source = w.sources.get("kv_allocated_bytes" if w.kv_allocated_bytes is not None else "available_kv_bytes", "")
    graphs = w.cuda_graph_bytes
    items = [LedgerItem(ItemKind.WEIGHTS, w.weights_bytes, w.sources.get("weights_bytes", "")),
             LedgerItem(ItemKind.KV_POOL, kv, kv_source),
             LedgerItem(ItemKind.GRAPHS, graphs, w.sources.get("cuda_graph_bytes", ""))]
    return [x for x in items if x.bytes]


def _by_pid(workers: Tuple[Worker, ...]) -> Dict[int, Worker]:
    out = {}
    for w in workers:
        m = _PID.search(w.rank)
        if m:
            out[int(m.group(1)[:10])] = w
    return out


def _engine_core(title: str, workers: Tuple[Worker, ...]) -> Optional[Worker]:
    """The title says ``EngineCore`` where the log prints ``EngineCore_DP0`` (or ``EngineCore_0``): the
    one engine core of the log is this one."""
    if not title.startswith("EngineCore"):
        return None
    cores = [w for w in workers if _name(w.rank).startswith("EngineCore")]
    return cores[0] if len(cores) == 1 else None


def place(engine: Engine, analysis: Optional[Analysis],
          gpu_of: Dict[int, int]) -> Dict[int, Tuple[str, List[LedgerItem]]]:
    """PID → (worker label, the log's items for it) for every engine process that holds a GPU."""
    workers = analysis.ranks if analysis is not None else ()
    by_pid = _by_pid(workers)
    by_name = {_name(w.rank): w for w in workers if w.rank}
    names = [_name(w.rank) for w in workers]
    out: Dict[int, Tuple[str, List[LedgerItem]]] = {}
    unmatched: List[int] = []  # untitled processes on a GPU that no PID in the log names
    for proc, title in engine.workers:
        if proc.pid not in gpu_of:
            continue
        w = by_pid.get(proc.pid) or (by_name.get(title) if title else None) or _engine_core(title, workers)
        fallback = title or "worker GPU{}".format(gpu_of[proc.pid])  # metrics key on it: never the PID
        out[proc.pid] = (_label(w, fallback, proc.pid, names, gpu_of), logged_items(w))
        if w is None and not title:
            unmatched.append(proc.pid)
    out.update(_driver(engine, workers, by_pid, names, gpu_of, unmatched))
    return out


def _label(w: Optional[Worker], fallback: str, pid: int, names: List[str], gpu_of: Dict[int, int]) -> str:
    """A rank label that survives a restart (metrics key on it): the log's process name without
    its PID when the name is unique (``Worker_TP0``), else the name and the GPU (V0's workers all
    print ``VllmWorkerProcess``: ``VllmWorkerProcess GPU2``)."""
    if w is None or not w.rank:
        return fallback
    name = _name(w.rank)
    return name if names.count(name) == 1 else "{} GPU{}".format(name, gpu_of.get(pid, "?"))


def _driver(engine: Engine, workers: Tuple[Worker, ...], by_pid: Dict[int, Worker], names: List[str],
            gpu_of: Dict[int, int], unmatched: List[int]) -> Dict[int, Tuple[str, List[LedgerItem]]]:
    """V0's driver worker (rank 0), whose lines carry no prefix: {PID: (label, items)}, or {} when
    no process is it."""
    bare = next((w for w in workers if not w.rank), None)
    server = engine.server
    titled = any(title for _, title in engine.workers)
    if server is not None and server.pid in gpu_of and not titled:
        # V0 run with --disable-frontend-multiprocessing (or before 0.6.0): the server process runs
        # the driver worker (rank 0) on its own GPU.
        w = by_pid.get(server.pid) or bare
        return {server.pid: (_label(w, DRIVER, server.pid, names, gpu_of), logged_items(w))}
    if bare is not None and len(unmatched) == 1:
        # V0 from 0.6.0: the OpenAI server spawns the engine (api_server.py build_async_engine_client_from_
        # engine_args, multiprocessing "spawn"), an untitled child that runs the driver; its lines carry no
        # prefix, the other ranks' print their PIDs.
        return {unmatched[0]: (DRIVER, logged_items(bare))}
    return {}
