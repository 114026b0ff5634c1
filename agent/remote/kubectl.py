"""Inspect an engine in a Kubernetes pod: the probe through ``kubectl exec``, the log through ``kubectl logs``.

``k8s:NAMESPACE/POD[/CONTAINER]``: the probe (agent/remote/probe.py) goes on the stdin of
``kubectl exec -i [--context C] -n NS POD [-c CONTAINER] -- python3 -I -``, exactly as over SSH, and its
answer is checked the same way. The engine's startup comes from ``kubectl logs`` (streamed to a
bounded temporary file, read by the same reader as any log file); when the container restarted and
its current log holds no startup, ``kubectl logs --previous`` is read and the note says so.
Names are checked against Kubernetes' rules before kubectl runs, and travel as argv elements: no
shell ever sees them.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
import unicodedata
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from kvforensics.agent.remote import probe as probe_mod
from kvforensics.agent.remote import stopping
from kvforensics.collectors import pods

PREFIX = "k8s:"
MAX_STDOUT_BYTES = 64 << 20
MAX_STDERR_BYTES = 1 << 20
MAX_LOG_BYTES = 256 << 20  # a startup is near the top of a log; a log this large is cut, and the note says so
LOG_TAIL_LINES = 2_000_000
_NO_PYTHON = ("executable file not found", "No such file or directory", "not found")


class KubectlError(Exception):
    """status: a fleet status (unreachable | auth_failed | error); code: the problem's code."""

    def __init__(self, status: str, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


@dataclass(frozen=True)
class PodTarget:
    """A ``k8s:NAMESPACE/POD[/CONTAINER]`` target, parsed; container None: the one kubectl picks by default."""

    namespace: str
    pod: str
    container: Optional[str] = None

    @property
    def label(self) -> str:
        return "/".join(x for x in (self.namespace, self.pod, self.container) if x)


@dataclass(frozen=True)
class PodResult:
    """One pod's result in a k8s run: its snapshot, or the status and problem that stopped it."""

    target: str  # as typed: k8s:NS/POD[/CONTAINER]
    status: str
    snapshot: Optional[Dict[str, Any]]
    problem: Optional[Tuple[str, str]] = None
    duration_s: float = 0.0


def is_target(name: str) -> bool:
    return name.startswith(PREFIX)


def parse_target(name: str) -> PodTarget:
    """``k8s:NAMESPACE/POD[/CONTAINER]``, each a Kubernetes name; ValueError says why."""
    parts = name[len(PREFIX):].split("/")
    if len(parts) not in (2, 3) or not pods.valid_reference(parts[0], parts[1], parts[2] if len(parts) == 3 else None):
        raise ValueError("{!r}: a pod is k8s:NAMESPACE/POD[/CONTAINER], Kubernetes names (lowercase letters, digits, "
                         "- and, in a pod name, .)".format(name))
    return PodTarget(namespace=parts[0], pod=parts[1], container=parts[2] if len(parts) == 3 else None)


def check_context(context: Optional[str]) -> None:
    """A kubeconfig context name: it must not read as an option."""
    if context is not None and (not context or context.startswith("-") or any(c.isspace() or ord(c) < 32
                                                                              for c in context)):
        raise ValueError("--context {!r} is not a kubeconfig context name".format(context))


def _pod_args(context: Optional[str], target: PodTarget, container: bool = True) -> List[str]:
    argv = (["--context", context] if context else []) + ["-n", target.namespace, target.pod]
    return argv + (["-c", target.container] if container and target.container else [])


def get_argv(target: PodTarget, context: Optional[str]) -> List[str]:
    """kubectl get pod [--context C] -n NS POD -o json"""
    return ["kubectl", "get", "pod"] + _pod_args(context, target, container=False) + ["-o", "json"]


_QOS = {"Guaranteed": "guaranteed", "Burstable": "burstable", "BestEffort": "besteffort"}
_DEFAULT_CONTAINER = "kubectl.kubernetes.io/default-container"


def reached_pod(obj: Any, target: PodTarget) -> Optional[Dict[str, Any]]:
    """The snapshot's ``pod`` from the API server's pod object: its uid and QoS class, and the container
    kubectl exec entered (the one named, else the default-container annotation, else the first: kubectl's
    own rule). None when the object is not the pod asked for."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(meta, dict) or meta.get("name") != target.pod or meta.get("namespace") != target.namespace:
        return None
    uid = meta.get("uid")
    if not isinstance(uid, str) or not 0 < len(uid) <= 64:
        return None
    spec, status = obj.get("spec"), obj.get("status")
    containers = spec.get("containers") if isinstance(spec, dict) else None
    names = [c.get("name") for c in (containers if isinstance(containers, list) else ())
             if isinstance(c, dict) and isinstance(c.get("name"), str) and len(c["name"]) <= 63]
    notes = meta.get("annotations") if isinstance(meta.get("annotations"), dict) else {}
    named = notes.get(_DEFAULT_CONTAINER)
    default = named if isinstance(named, str) and named in names else (names[0] if names else None)
    qos = status.get("qosClass") if isinstance(status, dict) else None
    return {"namespace": target.namespace, "name": target.pod, "uid": uid,
            "container": target.container or default, "qos": _QOS.get(qos) if isinstance(qos, str) else None}


def get_pod(target: PodTarget, context: Optional[str], deadline: float) -> Optional[Dict[str, Any]]:
    """``reached_pod`` of ``kubectl get pod -o json``; None when kubectl cannot say (the report's pod is then
    null, as before: the snapshot itself is not lost over it)."""
    try:
        code, out, _ = _run(get_argv(target, context), b"", deadline)
        return reached_pod(json.loads(out.decode("utf-8", "replace")), target) if code == 0 else None
    except (KubectlError, ValueError, RecursionError):  # RecursionError: JSON nested past Python's stack
        return None


def exec_argv(target: PodTarget, context: Optional[str]) -> List[str]:
    """kubectl exec -i [--context C] -n NS POD [-c CONTAINER] -- python3 -I -"""
    return ["kubectl", "exec", "-i"] + _pod_args(context, target) + ["--"] + probe_mod.REMOTE_COMMAND.split()


def logs_argv(target: PodTarget, context: Optional[str], previous: bool) -> List[str]:
    """kubectl logs [--context C] -n NS POD [-c CONTAINER] --tail N [--previous]"""
    return ["kubectl", "logs"] + _pod_args(context, target) + ["--tail", str(LOG_TAIL_LINES)] + (
        ["--previous"] if previous else [])


def _cannot_run(exc: OSError) -> KubectlError:
    return KubectlError("error", "kubectl.missing", "cannot run kubectl: {}".format(exc.strerror or exc))


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise KubectlError("unreachable", "kubectl.timeout", "deadline reached (--timeout)")
    return left


class _Kubectl:
    """One kubectl process in a process group of its own (stopping.OWN_PROCESS_GROUP), so that the deadline,
    Ctrl-C or SIGTERM kills it and whatever it forked (a wrapper script's child); its stderr kept to
    MAX_STDERR_BYTES in memory (nothing spooled to /tmp), the rest read and dropped. None is started once the
    deadline has passed."""

    def __init__(self, argv: List[str], stdin: Any, deadline: float) -> None:
        left = _left(deadline)
        if _STOPPING.is_set():  # Ctrl-C or SIGTERM: no new kubectl (a worker would try --previous next)
            raise KubectlError("error", "kubectl.interrupted", "interrupted before kubectl {} ran".format(argv[1]))
        try:
            self.proc = subprocess.Popen(argv, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         **stopping.OWN_PROCESS_GROUP)
        except OSError as exc:
            raise _cannot_run(exc) from None
        _LIVE.add(self.proc)
        self.expired = threading.Event()
        self._err = bytearray()
        self._dropped = False
        self._reader = threading.Thread(target=self._drain_stderr, daemon=True)
        self._reader.start()
        self._timer = threading.Timer(left, self._expire)
        self._timer.start()

    def _expire(self) -> None:
        self.expired.set()
        stopping.kill_group(self.proc)

    def _drain_stderr(self) -> None:
        """Its first and last MAX_STDERR_BYTES / 2: kubectl's own error comes last, after whatever flooded."""
        assert self.proc.stderr is not None
        half = MAX_STDERR_BYTES // 2
        tail = bytearray()
        for chunk in iter(lambda: self.proc.stderr.read1(1 << 16), b""):  # type: ignore[union-attr]
            room = half - len(self._err)
            if room > 0:
                self._err += chunk[:room]
                chunk = chunk[room:]
            tail += chunk
            del tail[:max(0, len(tail) - half)]
            self._dropped = self._dropped or len(tail) == half
        self._err += (b"\n" if self._dropped else b"") + tail

    def finish(self, what: str) -> Tuple[int, str]:
        """Stop it (a no-op once it exited), reap it; (exit status, stderr made printable)."""
        self._timer.cancel()
        stopping.kill_group(self.proc)
        self.proc.wait()
        self._reader.join(timeout=5)
        _LIVE.discard(self.proc)
        if self.expired.is_set():
            raise KubectlError("unreachable", "kubectl.timeout", "deadline reached while kubectl {} ran "
                               "(--timeout)".format(what))
        return self.proc.returncode, printable(bytes(self._err).decode("utf-8", "replace"))


_LIVE: "set" = set()  # every kubectl running now, for Ctrl-C and SIGTERM (run)
_STOPPING = threading.Event()  # set by run on Ctrl-C or SIGTERM: no kubectl starts after it


def printable(text: str) -> str:
    """kubectl's (or a wrapper's) words with control characters, ESC and OSC sequences among them, taken out:
    they reach the terminal and the one-line rows otherwise."""
    return "".join(ch for ch in text if ch in "\n\t" or unicodedata.category(ch) not in ("Cc", "Cf"))


def _run(argv: List[str], stdin: bytes, deadline: float) -> Tuple[int, bytes, str]:
    """kubectl with ``stdin`` (fed by a thread), its stdout read here at most MAX_STDOUT_BYTES, killed with its
    process group at the deadline."""
    k = _Kubectl(argv, subprocess.PIPE, deadline)
    threading.Thread(target=_feed, args=(k.proc, stdin), daemon=True).start()
    out = b""
    try:
        out = _read_bounded(k.proc)
    finally:
        code, err = k.finish(argv[1])
    return code, out, err


def _feed(proc: subprocess.Popen, data: bytes) -> None:
    assert proc.stdin is not None
    try:
        proc.stdin.write(data)
        proc.stdin.close()
    except OSError:  # kubectl exited first: what it said is the answer
        pass


def _read_bounded(proc: subprocess.Popen) -> bytes:
    out = bytearray()
    assert proc.stdout is not None
    for chunk in iter(lambda: proc.stdout.read1(1 << 16), b""):  # type: ignore[union-attr]
        out += chunk
        if len(out) > MAX_STDOUT_BYTES:
            raise KubectlError("error", "kubectl.too_much", "kubectl printed more than {} MiB: not a kvforensics "
                               "probe answer".format(MAX_STDOUT_BYTES >> 20))
    return bytes(out)


MAX_SAID = 300  # of kubectl's last line, in a one-line error


def _said(stderr: str, none: str = "no message") -> str:
    """kubectl's last line, at most MAX_SAID characters."""
    last = " ".join(stderr.strip().splitlines()[-1:]) or none
    return last if len(last) <= MAX_SAID else last[:MAX_SAID - 1] + "…"


def classify(returncode: int, stderr: str, target: PodTarget) -> KubectlError:
    """kubectl's failure as one line: the pod missing, exec forbidden, no python3 in the image, or as it said."""
    last = _said(stderr)
    if "(NotFound)" in stderr or "not found" in stderr and "pods" in stderr and "python3" not in stderr:
        return KubectlError("unreachable", "kubectl.pod_not_found", "pod {} not found: {}".format(target.label, last))
    if "(Forbidden)" in stderr or "forbidden" in stderr.lower():
        return KubectlError("auth_failed", "kubectl.forbidden", "{}: kubectl was refused (RBAC needs create on "
                            "pods/exec and get on pods/log): {}".format(target.label, last))
    if returncode in (126, 127) or ("python3" in stderr and any(s in stderr for s in _NO_PYTHON)):
        return KubectlError("error", "probe.python_not_found", "{}: no python3 in the container's image "
                            "(kvforensics needs only python3 >= 3.8 there; nothing is installed): {}".format(
                                target.label, last))
    return KubectlError("error", "kubectl.failed", "{}: kubectl exited {}: {}".format(target.label, returncode, last))


def probe_pod(target: PodTarget, context: Optional[str], probe: probe_mod.Probe, deadline: float) -> Dict[str, Any]:
    """The verified snapshot from inside the pod."""
    code, out, stderr = _run(exec_argv(target, context), probe.script, deadline)
    if code != 0 and probe_mod.MARKER.encode() not in out:
        raise classify(code, stderr, target)
    try:
        return probe_mod.parse_answer(out, probe)
    except probe_mod.ProbeError as exc:
        raise KubectlError("error", exc.code, "{}: {} (exit {}; {})".format(
            target.label, exc.message, code, _said(stderr, "no stderr"))) from None


def _stream_log(argv: List[str], path: str, deadline: float) -> Tuple[int, bool, str]:
    """``kubectl logs`` streamed into ``path``, at most MAX_LOG_BYTES, killed at the deadline: (exit, cut, stderr)."""
    with open(path, "wb") as out:
        k = _Kubectl(argv, subprocess.DEVNULL, deadline)
        cut = False
        try:
            cut = _copy(k.proc, out)
        finally:
            code, err = k.finish("logs")
        return code, cut, err


def _copy(proc: subprocess.Popen, out: Any) -> bool:
    """Copy kubectl's stdout until it ends or MAX_LOG_BYTES were written; True when cut."""
    written = 0
    assert proc.stdout is not None
    for chunk in iter(lambda: proc.stdout.read1(1 << 16), b""):  # type: ignore[union-attr]
        out.write(chunk[:MAX_LOG_BYTES - written])
        written += len(chunk)
        if written >= MAX_LOG_BYTES:
            return True
    return False


def read_log(target: PodTarget, context: Optional[str], startup: int, engine: str, deadline: float,
             folder: str) -> Dict[str, Any]:
    """The engine_log section read from ``kubectl logs``, then ``--previous`` when the current log holds no
    startup (a restarted container)."""
    from kvforensics.collectors import engine_logs

    section: Dict[str, Any] = {}
    for previous in (False, True):
        path = os.path.join(folder, "previous.log" if previous else "current.log")
        code, cut, stderr = _stream_log(logs_argv(target, context, previous), path, deadline)
        if code not in (0, -9, None) and not os.path.getsize(path):
            # no previous container: the current log's answer stands; no log at all: the probe's snapshot does
            return section if previous else _unreadable(logs_argv(target, context, False), classify(code, stderr,
                                                                                                   target))
        section = engine_logs.collect(("file", path), None, startup, engine)
        _label(section, target, previous, cut, path)
        if section["status"] == "ok" or not _restart_may_hold_it(section):
            return section
    return section


def _unreadable(argv: List[str], failure: KubectlError) -> Dict[str, Any]:
    """An engine_log section for a ``kubectl logs`` that failed (pods/log forbidden, say)."""
    return {"status": "failed", "source": " ".join(argv[:2]), "lines": [], "index": None, "count": None,
            "index_from_end": None, "engine": None, "notes": [],
            "problems": [{"code": "engine_log.unreadable", "message": failure.message}]}


def _restart_may_hold_it(section: Dict[str, Any]) -> bool:
    codes = {p.get("code") for p in section.get("problems", [])}
    return bool(codes & {"engine_log.no_startup", "engine_log.empty"})


def _label(section: Dict[str, Any], target: PodTarget, previous: bool, cut: bool, path: str) -> None:
    """Say which log was read, in place of the temporary file's name."""
    source = "kubectl logs{} {}".format(" --previous" if previous else "", target.label)
    section["source"] = source
    for item in section.get("problems", []):
        item["message"] = item["message"].replace(path, source)
    section["notes"] = [n.replace(path, source) for n in section.get("notes", [])]
    note = "k8s:{}: read {}{}".format(target.label, source, " (the previous container's log: the container "
                                      "restarted and its current log holds no startup)" if previous else "")
    section["notes"].insert(0, note + ("; cut at {} MiB".format(MAX_LOG_BYTES >> 20) if cut else ""))


def collect_one(name: str, context: Optional[str], probe: probe_mod.Probe, options: Dict[str, Any],
                timeout_s: float) -> PodResult:
    """One pod: its snapshot with the engine log from kubectl logs, or its failure in one line."""
    start = time.monotonic()
    deadline = start + timeout_s
    try:
        target = parse_target(name)
        if shutil.which("kubectl") is None:
            raise KubectlError("error", "kubectl.missing", "kubectl is not installed (not on PATH)")
        snap = probe_pod(target, context, probe, deadline)
        snap["pod"] = get_pod(target, context, deadline)
        if not options.get("log"):  # --log names a file inside the pod: the probe read it there
            with tempfile.TemporaryDirectory(prefix="kvf-k8s-") as folder:
                snap["engine_log"] = read_log(target, context, options.get("startup", -1), _engine(snap), deadline,
                                              folder)
        return PodResult(target=name, status="ok", snapshot=snap, duration_s=time.monotonic() - start)
    except KubectlError as exc:
        return PodResult(target=name, status=exc.status, snapshot=None, problem=(exc.code, exc.message),
                         duration_s=time.monotonic() - start)
    except (TypeError, AttributeError, KeyError, IndexError, RecursionError, UnicodeError) as exc:
        # what kubectl printed had a shape no pod object or probe answer has: this pod's error, not the run's
        return PodResult(target=name, status="error", snapshot=None,
                         problem=("kubectl.malformed", "{}: kubectl printed what is not a pod's answer ({})".format(
                             name, type(exc).__name__)), duration_s=time.monotonic() - start)


def _engine(snap: Dict[str, Any]) -> str:
    """The log's engine: the kind of the server the probe chose, else "auto"."""
    from kvforensics.collectors.snapshot import engine_kind

    engines = snap.get("engines") or {}
    chosen = engines.get("selected")
    listed = engines.get("engines") or []
    return engine_kind(listed[chosen]) if isinstance(chosen, int) and 0 <= chosen < len(listed) else "auto"


def run(names: Sequence[str], context: Optional[str], options: Dict[str, Any], timeout_s: float,
        parallel: int) -> List[PodResult]:
    """Every pod's result, in the order given."""
    probe = probe_mod.build(dict(options, time_limit_s=timeout_s))
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(parallel, len(names))))
    _STOPPING.clear()
    futures: List[concurrent.futures.Future] = []
    with stopping.sigterm_interrupts(_STOPPING):
        try:
            futures = [pool.submit(collect_one, n, context, probe, options, timeout_s) for n in names]
            return [f.result() for f in futures]
        except BaseException:  # Ctrl-C, SIGTERM: the pods not begun are dropped, every kubectl and its children
            _STOPPING.set()  # killed now; the workers then end and remove their temporary folders
            for future in futures:
                future.cancel()
            for proc in list(_LIVE):
                stopping.kill_group(proc)
            raise
        finally:
            pool.shutdown(wait=True)
