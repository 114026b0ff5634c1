"""Prometheus textfile for node_exporter's textfile collector.

Base units (bytes, seconds), the ``kvforensics_`` prefix, no timestamps (the textfile
collector rejects them), no PID labels (they churn). Labels: ``gpu`` (index), ``uuid``,
``engine`` (``sglang-<port>``, ``vllm-<port>``), ``rank`` (``TP3``), ``collector``, ``code``, ``severity``;
and on every engine series and finding, when the engine runs in a Kubernetes pod, ``namespace``,
``pod`` and ``container``: two pods on one node may run the same engine on the same port, and their
series must not be one series. Node-level series (GPU memory, host memory, collectors) carry none:
they describe the node whichever pod asks.
Written with prometheus-client's ``write_to_textfile``: a temp file renamed into place, so a
scrape never sees half a file.
"""

from __future__ import annotations

import time
from typing import Any, Dict, Optional, Tuple

from agent.model.live import Inspection
from reports.plugin import VIEWS

PREFIX = "kvforensics_"


def engine_label(insp: Inspection) -> Optional[str]:
    return insp.engine


def pod_labels(insp: Inspection) -> Tuple[Tuple[str, str], ...]:
    """(name, value) of the pod labels of the engine explained: none outside a pod (or unnamed on the node)."""
    engine = insp.snapshot.selected
    pod = engine.pod if engine is not None and insp.engine is not None else None
    return pod.labels() if pod is not None else ()


def registry(insp: Inspection, low_water: Optional[Dict[int, Any]] = None, samples: Optional[int] = None,
             run_min: Optional[Dict[int, int]] = None):
    """A CollectorRegistry holding one node's metrics. ``low_water``: gpu -> GpuLowWater of the engine
    run (also the source of a lost GPU's uuid and rank, so its series keep their labels);
    ``run_min``: gpu -> the least free memory over this record invocation's samples."""
    from prometheus_client import CollectorRegistry, Gauge

    reg = CollectorRegistry()

    def gauge(name: str, doc: str, labels=()):
        return Gauge(PREFIX + name, doc, list(labels), registry=reg)

    _gpus(gauge, insp, low_water or {}, run_min or {})
    _engine(gauge, insp, samples)
    pod = pod_labels(insp)
    findings = gauge("findings", "Findings of the last run, by code and severity.",
                     ("code", "severity") + tuple(k for k, _ in pod))
    counts: Dict[tuple, int] = {}
    for f in insp.findings:
        counts[(f.code, f.severity)] = counts.get((f.code, f.severity), 0) + 1
    for (code, severity), n in counts.items():
        findings.labels(code, severity, *(v for _, v in pod)).set(n)
    _collectors(gauge, insp)
    hm = insp.host_memory
    for key, doc in (("total_bytes", "Host RAM (MemTotal)."),
                     ("available_bytes", "Host RAM available (MemAvailable, cgroup-bounded).")):
        if hm.get(key) is not None:
            gauge("host_memory_" + key, doc).set(hm.get(key))
    gauge("margin_bytes", "--margin: memory kept free for runtime activations (the low-water alert's "
          "threshold).").set(insp.options.margin_bytes)
    if not insp.collected_nothing:  # a run that saw nothing did not succeed: RecordNotRunning may fire
        gauge("last_success_timestamp_seconds", "When kvforensics record last completed having collected "
              "something (Unix time).").set(time.time())
    return reg


def _gpus(gauge, insp: Inspection, low_water: Dict[int, Any], run_min: Dict[int, int]) -> None:  # type: ignore[no-untyped-def]
    gpu_labels = ("gpu", "uuid")
    pod = pod_labels(insp)
    engine_labels = ("gpu", "uuid", "engine", "rank") + tuple(k for k, _ in pod)
    pod_values = tuple(v for _, v in pod)
    total = gauge("gpu_memory_total_bytes", "GPU memory, from nvmlDeviceGetMemoryInfo_v2 total.", gpu_labels)
    reserved = gauge("gpu_memory_reserved_bytes", "Memory the driver reserves (nvmlDeviceGetMemoryInfo_v2).",
                     gpu_labels)
    used = gauge("gpu_memory_used_bytes", "Used GPU memory, without the driver reserve (nvmlDeviceGetMemoryInfo_v2).",
                 gpu_labels)
    free = gauge("gpu_memory_free_bytes", "Free GPU memory now (nvmlDeviceGetMemoryInfo_v2).", gpu_labels)
    up = gauge("gpu_up", "1 if NVML answers for this GPU, 0 if it is lost.", gpu_labels)
    low = gauge("gpu_memory_free_low_water_bytes",
                "Lowest free GPU memory seen in the current engine run (kvforensics record history).", engine_labels)
    run_low = gauge("gpu_memory_free_min_bytes", "Lowest free GPU memory over this record run's samples (the "
                    "low-water alert's window is taken over these).", engine_labels)
    engine = engine_label(insp)
    for g in insp.gpus:
        lw = low_water.get(g.index)
        # A lost GPU answers no UUID: keep the last good sample's, so its series stay the same series.
        uuid = g.uuid or (lw.uuid if lw is not None else None) or ""
        rank = g.rank or (lw.rank if lw is not None else None) or ""
        up.labels(str(g.index), uuid).set(0 if g.status == "lost" else 1)
        for metric, value in ((total, g.total_bytes), (reserved, g.reserved_bytes), (used, g.used_bytes),
                              (free, g.free_bytes)):
            if value is not None:  # unknown is absent, never 0
                metric.labels(str(g.index), uuid).set(value)
        if engine is None or not rank:
            continue
        if lw is not None and lw.min_free_bytes is not None:
            low.labels(str(g.index), uuid, engine, rank, *pod_values).set(lw.min_free_bytes)
        if run_min.get(g.index) is not None:
            run_low.labels(str(g.index), uuid, engine, rank, *pod_values).set(run_min[g.index])


def _engine(gauge, insp: Inspection, samples: Optional[int]) -> None:  # type: ignore[no-untyped-def]
    engine = engine_label(insp)
    if engine is None:
        return
    pod = pod_labels(insp)
    names = ("engine",) + tuple(k for k, _ in pod)
    values = (engine,) + tuple(v for _, v in pod)
    a = insp.analysis
    if a is not None:
        kv_bytes = gauge("engine_kv_pool_bytes", "KV pool size per rank, from the engine's startup log.",
                         names + ("rank",))
        view = VIEWS.find(insp.engine_kind)
        for rank, kv in view.kv_pool_by_rank(insp) if view is not None else ():
            kv_bytes.labels(*values, rank).set(kv)
        if a.summary.max_total_num_tokens is not None:
            gauge("engine_kv_pool_tokens", "KV pool capacity in tokens (max_total_num_tokens).", names).labels(
                *values).set(a.summary.max_total_num_tokens)
    from agent.model.context import Context
    from agent.model.node_rules import unused_bytes

    # The same figure as the unused_gpu_memory finding: the run's low-water mark when recorded
    # history holds one, else NVML now; never negative; absent when a GPU is lost.
    unused = unused_bytes(Context.on_node(insp))
    if unused is not None:
        gauge("engine_unused_bytes", "Free memory on the engine's least-free GPU beyond the margin, at the run's "
              "low-water mark when recorded (what a larger KV budget, --mem-fraction-static or "
              "--gpu-memory-utilization, could give the KV pool).",
              names).labels(*values).set(unused)
    if samples is not None:
        gauge("engine_run_samples", "Samples recorded in the current engine run.", names).labels(*values).set(
            samples)


def _collectors(gauge, insp: Inspection) -> None:  # type: ignore[no-untyped-def]
    ok = gauge("collector_success", "0 if the collector failed (nvml also when there is no NVIDIA library or "
               "driver); 1 if it ran (for the others absent = nothing to collect is not a failure).", ("collector",))
    dur = gauge("collector_duration_seconds", "Time the collector took.", ("collector",))
    for run in insp.snapshot.collector_runs:
        failed = run.status == "failed" or (run.name == "nvml" and run.status == "absent")
        ok.labels(run.name).set(0 if failed else 1)
        if run.duration_s is not None:
            dur.labels(run.name).set(run.duration_s)


def write(path: str, reg) -> None:
    """Atomically (prometheus-client writes ``PATH.<pid>.<thread>`` and renames it into place).
    A run killed inside that window leaves its temporary file: the next run removes any whose
    writer is gone."""
    import glob
    import os
    import re

    from prometheus_client import write_to_textfile

    for stale in glob.glob(glob.escape(path) + ".*"):
        m = re.match(re.escape(path) + r"\.(\d+)\.\d+$", stale)
        if m and not os.path.exists("/proc/{}".format(m.group(1))):
            try:
                os.unlink(stale)
            except OSError:
                pass
    write_to_textfile(path, reg)


def render(reg) -> str:
    from prometheus_client import generate_latest

    return generate_latest(reg).decode("utf-8")
