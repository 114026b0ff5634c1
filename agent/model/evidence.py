"""A node's snapshot, checked and typed at the edge: the one place the raw dict is read.

Snapshots come from this machine's collectors, from a probe on another host (which may lie),
or from an evidence bundle (which may be forged). Each is validated against the published
schema (``agent/schemas/snapshot.schema.json``: types, ranges, sizes) and then parsed into
frozen records, so the model and the renderers never see a raw dict or a wrong type. A bad
snapshot is one ``EvidenceError`` sentence naming the first offending field.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple

from kvforensics.agent.model.records import Problem

SCHEMA_DIR = Path(__file__).resolve().parents[1] / "schemas"
# The collector runs about the engine a snapshot explains (collectors/snapshot.py): one each per engine
# when a look explains every engine; the others are the node's, whichever engine is explained.
ENGINE_COLLECTORS = ("engine_log", "model_config", "engine_http")


class EvidenceError(Exception):
    """The snapshot does not hold what a kvforensics snapshot must; one sentence."""


@lru_cache(maxsize=None)
def schema(name: str) -> Dict[str, Any]:
    """A published JSON Schema: ``report``, ``snapshot`` or ``history``."""
    with open(SCHEMA_DIR / "{}.schema.json".format(name), "r", encoding="utf-8") as f:
        return json.load(f)


@lru_cache(maxsize=None)
def _validator(name: str):  # type: ignore[no-untyped-def]
    import jsonschema

    return jsonschema.Draft202012Validator(schema(name))


def _no_constant(name: str) -> Any:
    raise ValueError("{} is not a JSON number".format(name))


# Parsed JSON can take far more memory than its text: "{}," is 3 characters and a 64-byte dict, so a 50 MiB
# bundle of empty GPU entries took 1.4 GiB before the schema could refuse it. A document's shape is
# therefore costed before it is parsed (what CPython allocates per value, rounded up), and one that would
# take more than SHAPE_RATIO × its size as objects is refused: the text plus its objects then stay within
# ~4× the text. Small documents are parsed as they are (their worst case is a few tens of MB).
SHAPE_RATIO = 3
SHAPE_FREE_CHARS = 1 << 20
_OBJECT, _ARRAY, _ITEM, _MEMBER, _STRING_VALUE = 184, 72, 40, 32, 57  # bytes: dict, list, value + slot, dict entry, str
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')  # one JSON string, linear (each character read once)


def _structure_bytes(text: str, start: int, end: int) -> int:
    """What the containers, members and scalar values in ``text[start:end]`` (outside strings) cost."""
    return (_OBJECT * text.count("{", start, end) + _ARRAY * text.count("[", start, end)
            + _ITEM * text.count(",", start, end) + _MEMBER * text.count(":", start, end))


def _object_bytes(text: str, budget: int) -> Optional[int]:
    """The memory ``json.loads(text)`` would take, roughly, or None once it passes ``budget``. Strings
    are skipped whole (what they hold is text, not structure); a key costs nothing more, as json keeps
    one object per distinct key. An unterminated string stops the count: json.loads refuses it."""
    if _structure_bytes(text, 0, len(text)) + _STRING_VALUE * (text.count('"') // 2) + len(text) <= budget:
        return 0  # within budget even if every bracket and comma inside strings were structure
    total, pos = 0, 0
    while pos < len(text) and total <= budget:
        quote = text.find('"', pos)
        end = len(text) if quote < 0 else quote
        total += _structure_bytes(text, pos, end)
        string = _STRING.match(text, quote) if quote >= 0 else None
        if string is None:
            break
        pos = string.end()
        if not text.startswith(":", pos):
            total += _STRING_VALUE + pos - quote
    return total if total <= budget else None


def check_shape(text: str) -> None:
    """EvidenceError when ``text`` would take more than SHAPE_RATIO × its size once parsed."""
    if len(text) <= SHAPE_FREE_CHARS:
        return
    if _object_bytes(text, SHAPE_RATIO * len(text)) is None:
        raise EvidenceError("{:,} bytes of JSON made of so many tiny values that they would take more than {}× "
                            "that as objects".format(len(text), SHAPE_RATIO))


def loads(text: str) -> Any:
    """Strict JSON: no NaN/Infinity, bounded nesting, number sizes and shape (check_shape); EvidenceError
    otherwise."""
    check_shape(text)
    try:
        return json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise EvidenceError("nested too deeply to be a kvforensics document") from None
    except ValueError as exc:  # also Python's 4,300-digit int limit
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise EvidenceError("not JSON ({})".format(first_line[:120])) from None


def check(name: str, document: Any) -> None:
    """Raise EvidenceError for the first way ``document`` departs from schema ``name``."""
    error = next(iter(_validator(name).iter_errors(document)), None)
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(top level)"
        message = error.message if len(error.message) <= 160 else error.message[:157] + "..."
        raise EvidenceError("{}: {}".format(where, message))


@lru_cache(maxsize=None)
def _section_validator(name: str):  # type: ignore[no-untyped-def]
    import jsonschema

    defs = schema("snapshot")["$defs"]
    return jsonschema.Draft202012Validator({"$ref": "#/$defs/{}".format(name), "$defs": defs})


def check_section(name: str, section: Any) -> None:
    """Raise EvidenceError unless ``section`` is a valid snapshot section ``name`` (a ``$defs`` entry, e.g.
    ``engine_log``): what the history keeps of a snapshot is checked as the snapshot would be."""
    if not isinstance(section, dict):
        raise EvidenceError("{}: not an object".format(name))
    error = next(iter(_section_validator(name).iter_errors(section)), None)
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or name
        raise EvidenceError("{}: {}".format(where, error.message[:160]))


@dataclass(frozen=True)
class GpuProcessSeen:
    """A PID NVML charges on one GPU, with the memory it uses there (None: NVML did not say)."""

    pid: int
    used_bytes: Optional[int]


@dataclass(frozen=True)
class Gpu:
    """One GPU in the snapshot's nvml section: its status (ok | partial | lost), NVML's raw figures (None: unknown),
    and the processes NVML charges on it."""

    index: int
    status: str
    uuid: Optional[str]
    name: Optional[str]
    total_bytes: Optional[int]
    reserved_bytes: Optional[int]
    used_bytes: Optional[int]
    free_bytes: Optional[int]
    processes: Tuple[GpuProcessSeen, ...]
    problems: Tuple[Problem, ...]
    pci_bus_id: Optional[str] = None  # NVML's "00000000:18:00.0", as dcgm-exporter labels it


@dataclass(frozen=True)
class Nvml:
    """The snapshot's nvml section: the collector's status (``unavailable``: absent or failed), the driver, each GPU."""

    status: Optional[str]
    driver_version: Optional[str]
    gpus: Tuple[Gpu, ...]
    problems: Tuple[Problem, ...]

    @property
    def unavailable(self) -> bool:
        return self.status in ("absent", "failed")


@dataclass(frozen=True)
class Pod:
    """The Kubernetes pod and container a process runs in, as the node's kubelet layout names them."""

    namespace: str
    name: str
    uid: str
    container: Optional[str]  # the container's name in the pod; None when the layout does not say which
    qos: Optional[str] = None  # "guaranteed" | "burstable" | "besteffort", from the cgroup

    def labels(self) -> Tuple[Tuple[str, str], ...]:
        """(label, value) pairs for metrics: namespace, pod and, when known, container."""
        return (("namespace", self.namespace), ("pod", self.name)) + (
            (("container", self.container),) if self.container else ())


@dataclass(frozen=True)
class Process:
    """A process on the node (an engine's, or one NVML charges) as the host's /proc describes it; None: not known."""

    pid: int
    missing: bool  # NVML charges a PID the host's /proc does not have
    cmdline: Tuple[str, ...] = ()
    user: Optional[str] = None
    container: Optional[str] = None  # "runtime:id12"
    start_time_s: Optional[float] = None
    other_namespace: bool = False  # not in this /proc because kvforensics runs in another PID namespace
    pod: Optional[Pod] = None  # a kubelet's container whose pod the node's log layout names


@dataclass(frozen=True)
class Engine:
    """One inference server: its main process (None when only workers are visible) and workers."""

    server: Optional[Process]
    workers: Tuple[Tuple[Process, str], ...]  # (process, rank as printed: "TP3")
    helpers: Tuple[Process, ...]
    server_args: Mapping[str, Any]
    port: int
    raw: Mapping[str, Any]  # the collector's dict, for the engine's own collectors' helpers
    kind: str  # the engine's registered name (collectors/plugin.py)

    @property
    def label(self) -> str:
        """How reports and metrics name it: ``<engine>-<port>``."""
        return "{}-{}".format(self.kind, self.port)

    @property
    def pod(self) -> Optional[Pod]:
        """The pod it runs in: its server's, else its first worker's that names one (they share a pod)."""
        procs = ([self.server] if self.server else []) + [p for p, _ in self.workers] + list(self.helpers)
        return next((p.pod for p in procs if p.pod is not None), None)

    @property
    def pids(self) -> Tuple[int, ...]:
        return tuple(p.pid for p, _ in self.workers) + tuple(p.pid for p in self.helpers) + (
            (self.server.pid,) if self.server else ())


@dataclass(frozen=True)
class EngineLog:
    """The snapshot's engine_log section: the chosen startup's recognised lines (line number or None, offset, raw),
    where they were read, and which startup of how many (None: the log was not read whole)."""

    status: Optional[str]
    source: Optional[str]
    lines: Tuple[Tuple[Optional[int], int, str], ...]
    index: Optional[int]
    count: Optional[int]
    notes: Tuple[str, ...]
    problems: Tuple[Problem, ...]
    engine: Optional[str] = None  # whose startup the lines are: "sglang" | "vllm"


@dataclass(frozen=True)
class EngineHttp:
    """The snapshot's engine_http section: the loopback URL asked (None: not asked), the metrics the engine served."""

    url: Optional[str]
    metrics: Mapping[str, float]
    cache_config: Optional[Mapping[str, Any]] = None  # vLLM's cache_config_info labels
    network_namespace: Optional[str] = None  # the server's "net:[inode]" when asked inside it (a pod's)
    metrics_path: str = "/metrics"  # where the metrics were read (TensorRT-LLM: /prometheus/metrics)


@dataclass(frozen=True)
class HostMemory:
    """The snapshot's host_memory section: the host's RAM and swap, and its cgroup's memory limit (None: unknown)."""

    status: Optional[str]
    total_bytes: Optional[int]
    available_bytes: Optional[int]
    swap_total_bytes: Optional[int]
    swap_free_bytes: Optional[int]
    cgroup_limit_bytes: Optional[int]

    def get(self, key: str) -> Optional[int]:
        return getattr(self, key, None)


@dataclass(frozen=True)
class CollectorRun:
    """One collector's part in making the snapshot: its name, how it ended, and how long it took (None: not timed)."""

    name: str
    status: str
    duration_s: Optional[float]


@dataclass(frozen=True)
class Snapshot:
    """A validated snapshot document read into records: what the collectors saw on one node, the engine it explains."""

    hostname: Optional[str]
    taken_at_unix_s: Optional[float]
    nvml: Nvml
    host_memory: HostMemory
    engines: Tuple[Engine, ...]
    selected: Optional[Engine]  # the engine this snapshot explains
    processes: Mapping[int, Process]  # every PID NVML reported
    engine_log: EngineLog
    model_config: Optional[Mapping[str, Any]]
    model_config_path: Optional[str]
    http: EngineHttp
    collector_runs: Tuple[CollectorRun, ...]
    problems: Tuple[Problem, ...]  # every collector's, in section order
    raw: Mapping[str, Any]  # the validated document, for --save and for run keys
    pod: Optional[Pod] = None  # k8s: targets: the pod kubectl reached (the API server's names)

    @property
    def others(self) -> Tuple[Engine, ...]:
        return tuple(e for e in self.engines if e is not self.selected)

    @property
    def engine_pod(self) -> Optional[Pod]:
        """The pod of the engine explained: as the node's kubelet layout names it, else (a probe run inside the
        pod through kubectl, which sees no kubelet layout) the pod kubectl reached."""
        if self.selected is None:
            return None
        return self.selected.pod if self.selected.pod is not None else self.pod


def _problems(section: Mapping[str, Any]) -> Tuple[Problem, ...]:
    return tuple(Problem(p["code"], p["message"]) for p in section.get("problems") or ())


def _reached_pod(d: Optional[Mapping[str, Any]]) -> Optional[Pod]:
    if not d:
        return None
    return Pod(namespace=d["namespace"], name=d["name"], uid=d["uid"], container=d.get("container"), qos=d.get("qos"))


def _pod(container: Optional[Mapping[str, Any]]) -> Optional[Pod]:
    if not container or not (container.get("pod_uid") and container.get("namespace") and container.get("pod")):
        return None  # not a kubelet's, or its names are not on the node (a bundle from before they were read)
    return Pod(namespace=container["namespace"], name=container["pod"], uid=container["pod_uid"],
               container=container.get("name"), qos=container.get("qos"))


def _process(d: Mapping[str, Any]) -> Process:
    container = d.get("container")
    return Process(pid=d["pid"], missing=bool(d.get("missing")), cmdline=tuple(d.get("cmdline") or ()),
                   user=d.get("user"),
                   container="{}:{}".format(container["runtime"], container["id"][:12]) if container else None,
                   start_time_s=d.get("start_time_s"), other_namespace=bool(d.get("in_other_namespace")),
                   pod=_pod(container))


def _gpu(d: Mapping[str, Any]) -> Gpu:
    return Gpu(index=d["index"], status=d.get("status") or "ok", uuid=d.get("uuid"), name=d.get("name"),
               total_bytes=d.get("total_bytes"), reserved_bytes=d.get("reserved_bytes"), used_bytes=d.get("used_bytes"),
               free_bytes=d.get("free_bytes"),
               processes=tuple(GpuProcessSeen(pid=p["pid"], used_bytes=p.get("used_bytes"))
                               for p in d.get("processes") or ()),
               problems=_problems(d), pci_bus_id=d.get("pci_bus_id"))


def _engine(d: Mapping[str, Any]) -> Engine:
    from kvforensics.collectors.snapshot import engine_kind, engine_port

    server = d.get("server")
    return Engine(server=_process(server) if server else None,
                  workers=tuple((_process(s), s["rank"]) for s in d.get("schedulers") or ()),
                  helpers=tuple(_process(h) for h in d.get("helpers") or ()),
                  server_args=dict(d.get("server_args") or {}), port=engine_port(d), raw=d, kind=engine_kind(d))


def _nvml(nv: Mapping[str, Any]) -> Nvml:
    return Nvml(status=nv.get("status"), driver_version=nv.get("driver_version"),
                gpus=tuple(_gpu(g) for g in nv.get("gpus") or ()), problems=_problems(nv))


def _host_memory(hm: Mapping[str, Any]) -> HostMemory:
    return HostMemory(status=hm.get("status"), total_bytes=hm.get("total_bytes"),
                      available_bytes=hm.get("available_bytes"), swap_total_bytes=hm.get("swap_total_bytes"),
                      swap_free_bytes=hm.get("swap_free_bytes"), cgroup_limit_bytes=hm.get("cgroup_limit_bytes"))


def _engine_log(log: Mapping[str, Any]) -> EngineLog:
    return EngineLog(status=log.get("status"), source=log.get("source"),
                     lines=tuple(tuple(x) for x in log.get("lines") or ()),  # type: ignore[misc]
                     index=log.get("index"), count=log.get("count"), notes=tuple(log.get("notes") or ()),
                     problems=_problems(log), engine=log.get("engine"))


def _engine_http(http: Mapping[str, Any]) -> EngineHttp:
    cache_config = http.get("cache_config")
    return EngineHttp(url=http.get("url"), metrics=dict(http.get("metrics") or {}),
                      cache_config=dict(cache_config) if isinstance(cache_config, dict) else None,
                      network_namespace=http.get("network_namespace"),
                      metrics_path=http.get("metrics_path") or "/metrics")


def _gpu_processes(document: Mapping[str, Any]) -> Dict[int, Process]:
    """Every PID NVML reported, as the host's /proc describes it."""
    listed = (document.get("gpu_processes") or {}).get("processes") or {}
    return {int(k): _process(v) for k, v in listed.items()}


def _collector_runs(document: Mapping[str, Any]) -> Tuple[CollectorRun, ...]:
    return tuple(CollectorRun(name=r["name"], status=r["status"], duration_s=r.get("duration_s"))
                 for r in document.get("collector_runs") or ())


_SECTIONS = ("nvml", "host_memory", "engines", "engine_log", "model_config", "engine_http")


def _all_problems(document: Mapping[str, Any]) -> Tuple[Problem, ...]:
    """Every section's problems in section order, then the log reader's notes."""
    problems = []
    for key in _SECTIONS:
        problems.extend(_problems(document.get(key) or {}))
    log = document.get("engine_log") or {}
    problems.extend(Problem("engine_log.reader", note) for note in log.get("notes") or ())
    return tuple(problems)


def _known(entry: Mapping[str, Any]) -> bool:
    """An engine entry this kvforensics has a plug-in for (one written by a newer version may not)."""
    from kvforensics.collectors.plugin import ENGINES
    from kvforensics.collectors.snapshot import engine_kind

    return ENGINES.find(engine_kind(entry)) is not None


def _unknown_engines(document: Mapping[str, Any]) -> Tuple[Problem, ...]:
    kinds = sorted({str(e.get("kind")) for e in (document.get("engines") or {}).get("engines") or ()
                    if not _known(e)})
    return tuple(Problem("engines.unknown_kind", "a {} server is in the snapshot, but this kvforensics has no "
                         "plug-in for that engine: it is left out".format(k)) for k in kinds)


class Collected(dict):  # type: ignore[type-arg]
    """A snapshot this process's own collectors just made (record's and serve's samples, local inspect).

    ``parse`` types it without the schema check: checking our own code's output on every run costs
    the jsonschema import and a validator (~50–100 ms of CPU) and finds nothing the suite's checks of
    the same collectors' output would not (a fake node's ``inspect --save`` read back with ``--from``,
    and every snapshot the suite sees printed, are checked against the schema). What
    arrives from elsewhere — a probe's answer, a saved file, a bundle — is a plain dict, checked."""


class Checked(dict):  # type: ignore[type-arg]
    """A snapshot that passed ``check("snapshot")`` in this process where it arrived (a probe's answer,
    agent/remote/probe.py ``parse_answer``): ``parse`` types it without checking it a second time, which
    cost each host of a fleet sweep another full schema walk (~10 ms of CPU) on the client."""


def parse(document: Any) -> Snapshot:
    """Validate and type a snapshot document; EvidenceError if it is not one."""
    from kvforensics.collectors.snapshot import selected_engine

    if not isinstance(document, dict) or document.get("schema") != "kvforensics.snapshot/1":
        raise EvidenceError("not a kvforensics snapshot (expected schema kvforensics.snapshot/1)")
    if type(document) not in (Collected, Checked):
        check("snapshot", document)
    engines_raw = [e for e in (document.get("engines") or {}).get("engines") or () if _known(e)]
    engines = tuple(_engine(e) for e in engines_raw)
    chosen = selected_engine(document)
    cfg = document.get("model_config") or {}
    return Snapshot(
        hostname=document.get("hostname"), taken_at_unix_s=document.get("taken_at_unix_s"),
        nvml=_nvml(document["nvml"]), host_memory=_host_memory(document.get("host_memory") or {}),
        engines=engines, selected=next((e for e, raw in zip(engines, engines_raw) if raw is chosen), None),
        processes=_gpu_processes(document), engine_log=_engine_log(document.get("engine_log") or {}),
        model_config=cfg.get("config"), model_config_path=cfg.get("path"),
        http=_engine_http(document.get("engine_http") or {}), collector_runs=_collector_runs(document),
        pod=_reached_pod(document.get("pod")),
        problems=_all_problems(document) + _unknown_engines(document), raw=document)
