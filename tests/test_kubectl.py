"""``kvforensics inspect k8s:NAMESPACE/POD[/CONTAINER]`` through kubectl, end to end on one machine.

No API server can run here, so ``kubectl`` alone is a stand-in (tests/kubectl_standin.py, on PATH in the
test's folder). The "pod" is real: tests/fakenode.py's vLLM stand-in started with ``unshare --pid --fork
--mount-proc --net`` (its own PID, mount and network namespaces, loopback up), its stdout a pipe the test
captures as the container's log. ``kubectl exec`` enters those namespaces with nsenter and runs the real
probe there on stdin; ``kubectl logs`` prints the captured log."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest

from tests.conftest import run_cli
from tests.fakenode import FAKE_LIB, ROOT, FakeVllmNode, build_fake_nvml
from tests.kubelet_shim import LO_UP

METRICS = ROOT / "tests" / "fixtures" / "vllm_metrics" / "v0.11.0_v1_dp2.prom"


def _why_not() -> Optional[str]:
    if os.geteuid() != 0:
        return "needs root (PID, mount and network namespaces)"
    missing = [t for t in ("unshare", "nsenter") if shutil.which(t) is None]
    return "needs " + ", ".join(missing) if missing else None


needs_namespaces = pytest.mark.skipif(_why_not() is not None, reason=_why_not() or "")


class NamespacedVllm(FakeVllmNode):
    """The fake vLLM server as a pod's container: PID 1 of its own PID namespace, with its own mount (a
    /proc of its own) and network namespaces; its stdout a pipe copied to ``pod.log``."""

    def __init__(self, workdir: Path, **kwargs: Any) -> None:
        super().__init__(workdir, port=8000, **kwargs)  # the pod's own loopback: no port is shared
        self.copier: Optional[threading.Thread] = None

    @property
    def pod_log(self) -> Path:
        return self.dir / "pod.log"

    def spawn(self, argv: List[str], out: Any, env: Dict[str, str],
              pass_fds: Tuple[int, ...] = ()) -> subprocess.Popen:
        pod = ["unshare", "--pid", "--fork", "--mount-proc", "--net", "--", sys.executable, "-c", LO_UP] + argv
        proc = subprocess.Popen(pod, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=str(self.dir), env=env, start_new_session=True)
        self.copier = threading.Thread(target=self._copy, args=(proc,), daemon=True)
        self.copier.start()
        return proc

    def _copy(self, proc: subprocess.Popen) -> None:
        with open(self.pod_log, "ab", buffering=0) as f:
            for chunk in iter(lambda: proc.stdout.read1(1 << 16), b""):  # type: ignore[union-attr]
                f.write(chunk)

    def init_pid(self) -> int:
        """The host PID of the pod's PID 1 (unshare's child)."""
        text = Path("/proc/{0}/task/{0}/children".format(self.server_pid)).read_text().split()
        return int(text[0])


@pytest.fixture(scope="module", autouse=True)
def fake_lib():
    return build_fake_nvml()


def _standin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pods: Dict[str, Dict[str, Any]]) -> Path:
    """kubectl on PATH (first), its pods, its call log; returns the call log."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    kubectl = bin_dir / "kubectl"
    kubectl.write_text("#!{}\nimport runpy, sys\nsys.path.insert(0, {!r})\nrunpy.run_module('tests.kubectl_standin', "
                       "run_name='__main__')\n".format(sys.executable, str(ROOT)))
    kubectl.chmod(0o755)
    (tmp_path / "pods.json").write_text(json.dumps(pods))
    calls = tmp_path / "calls.jsonl"
    monkeypatch.setenv("PATH", "{}{}{}".format(bin_dir, os.pathsep, os.environ.get("PATH", "")))
    monkeypatch.setenv("KVF_KUBECTL_PODS", str(tmp_path / "pods.json"))
    monkeypatch.setenv("KVF_KUBECTL_CALLS", str(calls))
    return calls


def _pod(node: NamespacedVllm, path: Optional[str] = None, log: Optional[Path] = None,
         previous: Optional[Path] = None) -> Dict[str, Any]:
    return {"pid": node.init_pid(), "path": path or os.path.dirname(sys.executable),
            "log": str(log or node.pod_log), "previous": str(previous) if previous else None}


UID = "7d5f6a2e-3c1b-4e8f-9a0d-2b4c6e8f1a3c"


def test_the_pod_kubectl_reached_from_the_api_servers_object():
    from kvforensics.agent.remote.kubectl import parse_target, reached_pod

    obj = {"metadata": {"name": "p", "namespace": "ns", "uid": UID,
                        "annotations": {"kubectl.kubernetes.io/default-container": "engine"}},
           "spec": {"containers": [{"name": "proxy"}, {"name": "engine"}]}, "status": {"qosClass": "BestEffort"}}
    assert reached_pod(obj, parse_target("k8s:ns/p")) == {"namespace": "ns", "name": "p", "uid": UID,
                                                          "container": "engine", "qos": "besteffort"}
    assert reached_pod(obj, parse_target("k8s:ns/p/proxy"))["container"] == "proxy"  # the one named
    del obj["metadata"]["annotations"]
    assert reached_pod(obj, parse_target("k8s:ns/p"))["container"] == "proxy"  # kubectl's first
    assert reached_pod(obj, parse_target("k8s:ns/other")) is None  # not the pod asked for
    assert reached_pod(dict(obj, metadata={"name": "p", "namespace": "ns"}), parse_target("k8s:ns/p")) is None
    assert reached_pod([1, 2], parse_target("k8s:ns/p")) is None and reached_pod(None, parse_target("k8s:ns/p")) is None


def _calls(path: Path) -> List[List[str]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _inspect(monkeypatch: pytest.MonkeyPatch, node: NamespacedVllm, *argv: str) -> Tuple[int, str, str]:
    monkeypatch.setenv("FAKE_NVML_SCENARIO", str(node.scenario))
    return run_cli(["inspect"] + list(argv) + ["--nvml-lib", str(FAKE_LIB)])


@needs_namespaces
def test_a_pod_end_to_end_probe_by_exec_startup_by_logs(tmp_path, monkeypatch):
    with NamespacedVllm(tmp_path / "n", tp=2, metrics_text=METRICS.read_text()) as n:
        calls = _standin(tmp_path, monkeypatch, {"inference/llama-0": dict(
            _pod(n), uid=UID, qos="Guaranteed", containers=["sidecar", "vllm"])})
        code, out, err = _inspect(monkeypatch, n, "k8s:inference/llama-0/vllm", "--json", "--context", "prod")
        monkeypatch.setenv("COLUMNS", "120")  # the one-screen report's problem lines whole (80 columns clips them)
        brief = _inspect(monkeypatch, n, "k8s:inference/llama-0/vllm", "--no-color")[1]
        line = _inspect(monkeypatch, n, "k8s:inference/llama-0/vllm", "k8s:inference/gone", "--format", "oneline")
        pids = dict(n.pids)
    assert code in (0, 1), err
    t = json.loads(out)["targets"][0]
    assert t["target"] == "k8s:inference/llama-0/vllm" and t["status"] == "ok", t["problems"]
    # the probe ran inside the pod: its PID namespace, where the engine is PID 1 and its workers hold the GPUs
    assert [(g["rank"], g["processes"][0]["pid"]) for g in t["gpus"]] == [("Worker_TP0", pids["tp0"]),
                                                                          ("Worker_TP1", pids["tp1"])]
    assert pids["server"] == 1
    # the server is PID 1 there (the container's entrypoint), and still its workers' server
    assert not [p for p in t["problems"] if p["code"] == "engines.server_not_found"], t["problems"]
    assert "other_engines" not in {f["code"] for f in t["findings"]}
    assert {"code": "engine_log.reader", "message": "k8s:inference/llama-0/vllm: read kubectl logs "
            "inference/llama-0/vllm"} in t["problems"]
    assert [r["rank"] for r in t["startup"]["ranks"]] == ["Worker_TP0 pid={}".format(pids["tp0"]),
                                                          "Worker_TP1 pid={}".format(pids["tp1"])]
    assert t["verdict"]
    # the pod as the API server names it: the probe inside cannot see the node's kubelet layout
    assert t["pod"] == {"namespace": "inference", "name": "llama-0", "uid": UID, "container": "vllm",
                        "qos": "guaranteed"}
    assert ["get", "pod", "--context", "prod", "-n", "inference", "llama-0", "-o", "json"] in _calls(calls)
    assert "pod inference/llama-0 (container vllm)" in brief
    exec_call = ["exec", "-i", "--context", "prod", "-n", "inference", "llama-0", "-c", "vllm", "--", "python3", "-I",
                 "-"]
    assert exec_call in _calls(calls)
    assert ["logs", "--context", "prod", "-n", "inference", "llama-0", "-c", "vllm", "--tail", "2000000"] in _calls(
        calls)
    assert "kubectl logs inference/llama-0/vllm" in brief
    # a fleet row per pod; the missing pod fails alone, with kubectl's message
    code, text, err = line
    assert code == 3
    rows = text.splitlines()[1:]
    assert rows[0].startswith("inference/llama-0/vllm\tok\t2\tvLLM")
    assert rows[1].startswith("inference/gone\tunreachable") and rows[1].endswith('pods "gone" not found')


@needs_namespaces
def test_previous_log_after_a_restart(tmp_path, monkeypatch):
    current = tmp_path / "current.log"
    current.write_text("INFO 12-01 10:00:00 [loader.py:42] loading weights again\n")
    with NamespacedVllm(tmp_path / "n", tp=2) as n:
        _standin(tmp_path, monkeypatch, {"inference/llama-0": _pod(n, log=current, previous=n.pod_log)})
        code, out, err = _inspect(monkeypatch, n, "k8s:inference/llama-0", "--json")
    t = json.loads(out)["targets"][0]
    assert t["status"] == "ok", t["problems"]
    assert {"code": "engine_log.reader", "message": "k8s:inference/llama-0: read kubectl logs --previous "
            "inference/llama-0 (the previous container's log: the container restarted and its current log holds "
            "no startup)"} in t["problems"]
    assert t["startup"]["ranks"]


@needs_namespaces
def test_no_python3_in_the_image(tmp_path, monkeypatch):
    empty = tmp_path / "image-bin"
    empty.mkdir()
    with NamespacedVllm(tmp_path / "n", tp=2) as n:
        _standin(tmp_path, monkeypatch, {"inference/slim-0": _pod(n, path=str(empty))})
        code, out, err = _inspect(monkeypatch, n, "k8s:inference/slim-0")
    assert code == 3
    assert err == "kvforensics: inference/slim-0: error: no python3 there (needed: python3 ≥ 3.8)\n", err


def test_pod_not_found_is_kubectls_message_in_one_line(tmp_path, monkeypatch):
    calls = _standin(tmp_path, monkeypatch, {})
    code, out, err = run_cli(["inspect", "k8s:inference/missing-0"])
    assert code == 3
    assert err == "kvforensics: inference/missing-0: unreachable: pod not found (-v)\n"  # 80 columns
    assert _calls(calls) == [["exec", "-i", "-n", "inference", "missing-0", "--", "python3", "-I", "-"]]
    code, out, err = run_cli(["inspect", "k8s:inference/missing-0", "-v"])  # the whole message, one line
    assert err == ('kvforensics: inference/missing-0: unreachable: pod inference/missing-0 not found: Error from '
                   'server (NotFound): pods "missing-0" not found\n')


def test_exec_forbidden_and_kubectl_missing(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    kubectl = bin_dir / "kubectl"
    kubectl.write_text("#!/bin/sh\necho 'Error from server (Forbidden): pods \"p\" is forbidden: User \"u\" cannot "
                       "create resource \"pods/exec\" in API group \"\" in the namespace \"ns\"' >&2\nexit 1\n")
    kubectl.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    code, _, err = run_cli(["inspect", "k8s:ns/p"])
    assert (code, err) == (3, "kvforensics: ns/p: auth_failed: RBAC: grant create pods/exec and get pods/log\n")
    kubectl.unlink()
    code, _, err = run_cli(["inspect", "k8s:ns/p"])
    assert (code, err) == (3, "kvforensics: ns/p: error: kubectl is not installed (not on PATH)\n")


@pytest.mark.parametrize("target", ["k8s:-rf/pod", "k8s:../x", "k8s:ns/a;b", "k8s:ns/pod/-c", "k8s:ns",
                                    "k8s:ns/pod/c/d", "k8s:NS/pod", "k8s:ns/$(id)"])
def test_hostile_names_are_refused_before_kubectl_runs(tmp_path, monkeypatch, target):
    calls = _standin(tmp_path, monkeypatch, {})
    code, _, err = run_cli(["inspect", target])
    assert code == 2 and "k8s:NAMESPACE/POD[/CONTAINER]" in err, err
    assert not calls.exists()


def test_a_hostile_context_is_refused_before_kubectl_runs(tmp_path, monkeypatch):
    calls = _standin(tmp_path, monkeypatch, {})
    code, _, err = run_cli(["inspect", "k8s:ns/pod", "--context=--kubeconfig=/tmp/x"])
    assert code == 2 and "not a kubeconfig context name" in err, err
    assert not calls.exists()


def test_a_silent_kubectl_ends_at_the_timeout(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    kubectl = bin_dir / "kubectl"
    kubectl.write_text("#!/bin/sh\nexec sleep 60\n")
    kubectl.chmod(0o755)
    monkeypatch.setenv("PATH", "{}{}{}".format(bin_dir, os.pathsep, os.environ.get("PATH", "")))
    code, _, err = run_cli(["inspect", "k8s:ns/p", "--timeout", "0.5"])
    assert (code, err) == (3, "kvforensics: ns/p: unreachable: deadline reached while kubectl ran (--timeout)\n")


@needs_namespaces
def test_logs_forbidden_costs_the_startup_not_the_snapshot(tmp_path, monkeypatch):
    with NamespacedVllm(tmp_path / "n", tp=2) as n:
        _standin(tmp_path, monkeypatch, {"inference/llama-0": dict(_pod(n), logs_forbidden=True)})
        code, out, err = _inspect(monkeypatch, n, "k8s:inference/llama-0", "--json")
    t = json.loads(out)["targets"][0]
    assert t["status"] in ("ok", "partial") and t["gpus"], t["problems"]
    assert any(p["code"] == "engine_log.unreadable" and "RBAC needs create on pods/exec and get on pods/log" in
               p["message"] for p in t["problems"]), t["problems"]
