"""Prometheus textfile for node_exporter's textfile collector (and ``serve``'s /metrics).

Base units (bytes, seconds), the ``kvforensics_`` prefix, no timestamps (the textfile
collector rejects them), no PID labels (they churn). One registry covers the node: the node's own
series (GPU and host memory, the node's collectors and findings, the last success) once, and each
engine's series (low-water marks, KV pool, unused memory, load, its findings, its collectors, its
margin, whether it is up) once per engine, labelled ``engine`` (``sglang-<port>``, ``vllm-<port>``)
and, when the engine runs in a Kubernetes pod, ``namespace``, ``pod`` and ``container``: two pods on
one node may run the same engine on the same port, and their series must not be one series. GPU
series carry ``gpu`` (index), ``uuid``, ``pci_bus_id`` (dcgm-exporter's label, with the same value: its
series join ours on it) and ``gpu_model`` (dcgm-exporter's ``modelName``; promtool wants snake case).
``rank`` is the engine's worker (``TP3``, ``Worker_TP1``).
Written with prometheus-client's ``write_to_textfile``: a temp file renamed into place, so a
scrape never sees half a file.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from kvforensics.agent.model.live import Inspection
from kvforensics.reports.plugin import VIEWS
from kvforensics.reports.textfile import PREFIX

Labels = Tuple[Tuple[str, str], ...]
GPU_LABELS = ("gpu", "uuid", "pci_bus_id", "gpu_model")
POD_LABELS = ("namespace", "pod", "container")
# Findings about the node, whichever engine is explained: written once, without an engine label.
NODE_FINDINGS = frozenset(("nvml_unavailable", "gpu_lost", "orphaned_gpu_memory", "pid_namespace", "engine_not_found",
                           "other_engines"))


@dataclass(frozen=True)
class EngineSeries:
    """One engine's look, with its run's history: ``low_water`` gpu -> GpuLowWater of the engine run (also
    the source of a lost GPU's labels, so its series stay the same series); ``run_min`` gpu -> the least
    free memory over this record invocation's samples."""

    inspection: Inspection
    low_water: Mapping[int, Any] = field(default_factory=dict)
    run_min: Mapping[int, int] = field(default_factory=dict)
    samples: Optional[int] = None


@dataclass(frozen=True)
class NodeSeries:
    """What one registry exports: every engine's series (the first one's inspection also gives the node's)."""

    engines: Tuple[EngineSeries, ...]
    gone: Tuple[Labels, ...] = ()  # engines recorded recently and not found now: engine_up 0
    last_success: Optional[float] = None  # the last sample that collected something (the history's)
    node: bool = True  # the node's own series too (False: --engine, beside the node's own writer)


def pod_labels(insp: Inspection) -> Labels:
    """(name, value) of the pod labels of the engine explained: none outside a pod (or unnamed on the node)."""
    engine = insp.snapshot.selected
    pod = engine.pod if engine is not None and insp.engine is not None else None
    return pod.labels() if pod is not None else ()


def of_inspection(insp: Inspection) -> NodeSeries:
    """One look without a history (the last success is now, when something was collected)."""
    return NodeSeries(engines=(EngineSeries(inspection=insp),),
                      last_success=None if insp.collected_nothing else time.time())


class _Gauges:
    """Declares each gauge once, with the label names given at first use."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry

        self.registry = CollectorRegistry()
        self._made: Dict[str, Any] = {}

    def __call__(self, name: str, doc: str, labels: Sequence[str] = ()):  # type: ignore[no-untyped-def]
        from prometheus_client import Gauge

        if name not in self._made:
            self._made[name] = Gauge(PREFIX + name, doc, list(labels), registry=self.registry)
        return self._made[name]


def registry(node: NodeSeries):  # type: ignore[no-untyped-def]
    """A CollectorRegistry holding one node's metrics."""
    gauge = _Gauges()
    engines = [e for e in node.engines if e.inspection.engine is not None]
    keys = _engine_label_names(engines, node.gone)
    identity = _gpu_identity(node)
    if node.node and node.engines:
        _node_series(gauge, node, identity, keys)
    for es in engines:
        _EngineExport(gauge, es, keys, identity).write()
    for labels in node.gone:
        values = dict(labels)
        _engine_up(gauge, keys).labels(*(values.get(k, "") for k in keys)).set(0)
    return gauge.registry


def _engine_label_names(engines: Sequence[EngineSeries], gone: Sequence[Labels]) -> Tuple[str, ...]:
    """``engine`` and the pod labels any engine has: one label set per metric, "" (absent to Prometheus)
    for an engine outside a pod."""
    present = {k for es in engines for k, _ in pod_labels(es.inspection)} | {k for g in gone for k, _ in g}
    return ("engine",) + tuple(k for k in POD_LABELS if k in present)


def _gpu_identity(node: NodeSeries) -> Dict[int, Tuple[str, str, str]]:
    """gpu -> (uuid, pci_bus_id, gpu_model): NVML's now, else what the history last recorded (a lost GPU
    answers none of them, and its series must stay the same series)."""
    out: Dict[int, Tuple[str, str, str]] = {}
    kept = [lw for es in node.engines for lw in es.low_water.values()]
    for g in node.engines[0].inspection.gpus if node.engines else ():
        old = [lw for lw in kept if lw.gpu == g.index]
        out[g.index] = (g.uuid or next((lw.uuid for lw in old if lw.uuid), ""),
                        g.pci_bus_id or next((lw.pci_bus_id for lw in old if lw.pci_bus_id), ""),
                        g.name or next((lw.name for lw in old if lw.name), ""))
    return out


def _node_series(gauge: _Gauges, node: NodeSeries, identity: Dict[int, Tuple[str, str, str]],
                 keys: Tuple[str, ...]) -> None:
    insp = node.engines[0].inspection
    _gpus(gauge, insp, identity)
    hm = insp.host_memory
    for key, doc in (("total_bytes", "Host RAM (MemTotal)."),
                     ("available_bytes", "Host RAM available (MemAvailable, cgroup-bounded).")):
        if hm.get(key) is not None:
            gauge("host_memory_" + key, doc).set(hm.get(key))
    _collectors(gauge, insp, keys, ("",) * len(keys), node=True)
    counts = _finding_counts(insp, node=True)
    findings = gauge("findings", _FINDINGS_DOC, ("code", "severity") + keys)
    for (code, severity), n in counts.items():
        findings.labels(code, severity, *("",) * len(keys)).set(n)
    if node.last_success is not None:  # kept across runs that collected nothing: RecordNotRunning may fire
        gauge("last_success_timestamp_seconds", "When a kvforensics sample last collected something (Unix time; "
              "a run that collects nothing leaves it as it was).").set(node.last_success)


_FINDINGS_DOC = ("Findings of the last look, by code and severity: the node's without an engine label, each "
                 "engine's with its labels.")


def _gpus(gauge: _Gauges, insp: Inspection, identity: Dict[int, Tuple[str, str, str]]) -> None:
    total = gauge("gpu_memory_total_bytes", "GPU memory, from nvmlDeviceGetMemoryInfo_v2 total.", GPU_LABELS)
    reserved = gauge("gpu_memory_reserved_bytes", "Memory the driver reserves (nvmlDeviceGetMemoryInfo_v2).",
                     GPU_LABELS)
    used = gauge("gpu_memory_used_bytes", "Used GPU memory, without the driver reserve (nvmlDeviceGetMemoryInfo_v2).",
                 GPU_LABELS)
    free = gauge("gpu_memory_free_bytes", "Free GPU memory now (nvmlDeviceGetMemoryInfo_v2).", GPU_LABELS)
    up = gauge("gpu_up", "1 if NVML answers for this GPU, 0 if it is lost.", GPU_LABELS)
    for g in insp.gpus:
        labels = (str(g.index),) + identity.get(g.index, ("", "", ""))
        up.labels(*labels).set(0 if g.status == "lost" else 1)
        for metric, value in ((total, g.total_bytes), (reserved, g.reserved_bytes), (used, g.used_bytes),
                              (free, g.free_bytes)):
            if value is not None:  # unknown is absent, never 0
                metric.labels(*labels).set(value)


def _collectors(gauge: _Gauges, insp: Inspection, keys: Tuple[str, ...], values: Tuple[str, ...],
                node: bool) -> None:
    """Each collector's success and duration: the node's (engine label "") or one engine's."""
    from kvforensics.agent.model.evidence import ENGINE_COLLECTORS

    names = ("collector",) + keys
    ok = gauge("collector_success", "0 if the collector failed (nvml also when there is no NVIDIA library or "
               "driver); 1 if it ran (for the others absent = nothing to collect is not a failure). The engine's "
               "own collectors (its log, model config, HTTP) carry its labels.", names)
    dur = gauge("collector_duration_seconds", "Time the collector took.", names)
    for run in insp.snapshot.collector_runs:
        if (run.name in ENGINE_COLLECTORS) == node:
            continue
        failed = run.status == "failed" or (run.name == "nvml" and run.status == "absent")
        ok.labels(run.name, *values).set(0 if failed else 1)
        if run.duration_s is not None:
            dur.labels(run.name, *values).set(run.duration_s)


def _finding_counts(insp: Inspection, node: bool) -> Dict[Tuple[str, str], int]:
    counts: Dict[Tuple[str, str], int] = {}
    for f in insp.findings:
        if (f.code in NODE_FINDINGS) == node:
            counts[(f.code, f.severity)] = counts.get((f.code, f.severity), 0) + 1
    return counts


def _engine_up(gauge: _Gauges, keys: Tuple[str, ...]):  # type: ignore[no-untyped-def]
    return gauge("engine_up", "1: the engine is found and explained; 0: it was recorded within the last hour and "
                 "is not found now (stopped, crashed, or its pod gone).", keys)


class _EngineExport:
    """One engine's series."""

    def __init__(self, gauge: _Gauges, es: EngineSeries, keys: Tuple[str, ...],
                 identity: Dict[int, Tuple[str, str, str]]) -> None:
        self.gauge, self.es, self.keys, self.identity = gauge, es, keys, identity
        self.insp = es.inspection
        values = dict(pod_labels(self.insp), engine=self.insp.engine or "")
        self.values = tuple(values.get(k, "") for k in keys)

    def write(self) -> None:
        _engine_up(self.gauge, self.keys).labels(*self.values).set(1)
        self._info()
        self._low_water()
        self._kv_pool()
        self._figures()
        self._load()
        _collectors(self.gauge, self.insp, self.keys, self.values, node=False)
        findings = self.gauge("findings", _FINDINGS_DOC, ("code", "severity") + self.keys)
        for (code, severity), n in _finding_counts(self.insp, node=False).items():
            findings.labels(code, severity, *self.values).set(n)

    def _info(self) -> None:
        names = ("kind", "version", "model", "budget_flag", "budget_value", "recommended_value")
        info = self.gauge("engine_info", "1, labelled with what the engine runs: its kind, its version or release "
                          "era (from its startup log), its model, its KV budget flag with the value it runs with, "
                          "and the value kvforensics recommends (\"\" when none).", self.keys + names)
        info.labels(*self.values, *engine_facts(self.insp)).set(1)

    def _low_water(self) -> None:
        names = GPU_LABELS + ("rank",) + self.keys
        low = self.gauge("gpu_memory_free_low_water_bytes", "Lowest free GPU memory in the current engine run "
                         "(window: since the engine's process started, from the kvforensics history).", names)
        run_low = self.gauge("gpu_memory_free_min_bytes", "Lowest free GPU memory over the samples of this record "
                             "run or serve look (window: one record invocation; the low-water alert takes "
                             "its minimum over an hour).", names)
        for g in self.insp.gpus:
            lw = self.es.low_water.get(g.index)
            rank = g.rank or (lw.rank if lw is not None else None)
            if not rank:
                continue
            labels = (str(g.index),) + self.identity.get(g.index, ("", "", "")) + (rank,) + self.values
            if lw is not None and lw.min_free_bytes is not None:
                low.labels(*labels).set(lw.min_free_bytes)
            if self.es.run_min.get(g.index) is not None:
                run_low.labels(*labels).set(self.es.run_min[g.index])

    def _kv_pool(self) -> None:
        a = self.insp.analysis
        if a is None:
            return
        kv_bytes = self.gauge("engine_kv_pool_bytes", "KV pool size per rank, from the engine's startup log.",
                              self.keys + ("rank",))
        view = VIEWS.find(self.insp.engine_kind)
        for rank, kv in view.kv_pool_by_rank(self.insp) if view is not None else ():
            kv_bytes.labels(*self.values, rank).set(kv)
        if a.summary.max_total_num_tokens is not None:
            self.gauge("engine_kv_pool_tokens", "KV pool capacity in tokens (max_total_num_tokens).",
                       self.keys).labels(*self.values).set(a.summary.max_total_num_tokens)

    def _figures(self) -> None:
        from kvforensics.agent.model.context import Context
        from kvforensics.agent.model.node_rules import unused_bytes

        # The same figure as the unused_gpu_memory finding: the run's low-water mark when recorded
        # history holds one, else NVML now; never negative; absent when a GPU is lost.
        unused = unused_bytes(Context.on_node(self.insp))
        if unused is not None:
            self.gauge("engine_unused_bytes", "Per engine, a figure for each of its GPUs: free memory on the "
                       "engine's least-free GPU beyond the margin, at the run's low-water mark when recorded "
                       "(what a larger KV budget, --mem-fraction-static or --gpu-memory-utilization, could give "
                       "the KV pool on every GPU).", self.keys).labels(*self.values).set(unused)
        if self.es.samples is not None:
            self.gauge("engine_run_samples", "Samples recorded in the current engine run.", self.keys).labels(
                *self.values).set(self.es.samples)
        self.gauge("margin_bytes", "--margin: memory kept free on each of the engine's GPUs for runtime "
                   "activations (the low-water alert's threshold).", self.keys).labels(*self.values).set(
                       self.insp.options.margin_bytes)

    def _load(self) -> None:
        """The engine's own gauges now (its plug-in's LoadMetrics): absent when it exports none."""
        from kvforensics.agent.plugin import ENGINES

        model = ENGINES.find(self.insp.engine_kind)
        load = model.load.read(self.insp.snapshot.http.metrics) if model is not None else {}
        for key, name, doc in (("kv_usage", "engine_kv_usage_ratio", "Share of the KV cache in use now (0–1), "
                                "from the engine's /metrics."),
                               ("running", "engine_requests_running", "Requests being served now (engine /metrics)."),
                               ("queued", "engine_requests_queued", "Requests waiting for room now (engine "
                                "/metrics).")):
            if load.get(key) is not None:
                self.gauge(name, doc, self.keys).labels(*self.values).set(load[key])


def engine_facts(insp: Inspection) -> Tuple[str, str, str, str, str, str]:
    """kind, version (or release era), model, KV budget flag, the value it runs with, the recommended value;
    "" for what is not known."""
    from kvforensics.agent.model.node_rules import live_settings
    from kvforensics.agent.plugin import ENGINES

    a = insp.analysis
    model = ENGINES.find(insp.engine_kind)
    flag = model.budget_flag if model is not None else ""
    key = flag.lstrip("-").replace("-", "_")
    settings = dict(getattr(a, "server_args", None) or {})
    settings.update(live_settings(insp))
    args = insp.engine_args or {}
    served = args.get("model_path") or args.get("model") or settings.get("model_path") or settings.get("model")
    recommended = next((r.value for r in insp.recommendations if r.flag == flag), "")
    return (insp.engine_kind or "", (a.era.hint or "") if a is not None else "", str(served or ""), flag,
            _number(settings.get(key)), str(recommended))


def _number(value: Any) -> str:
    if value is None or isinstance(value, bool):
        return ""
    try:
        return "{:g}".format(float(value))
    except (TypeError, ValueError):
        return str(value)[:64]


def render(reg: Any) -> str:
    from prometheus_client import generate_latest

    return generate_latest(reg).decode("utf-8")

