"""Containers and Kubernetes pods seen from the host: the runtime and container id from the cgroup, the
kubelet's pod from its cgroup shape and its log layout, the container's CRI log files, and HTTP inside
the container's network namespace.

Pure shapes are checked on strings and fixture trees; the rest on real processes in real cgroups and
real network namespaces (tests/kubelet.py), which need root: skipped without it."""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kvforensics.collectors import engine_http, engine_logs, netns, pods, procfs
from tests import kubelet
from tests.conftest import ROOT, run_cli
from tests.kubelet import Node, Pod, cri_record, why_not

UID = "5bcdc426-6c0b-4e86-a265-44ce4901c1d8"
CID = "24c50cd73dc05a7af7c35992360cbeba442e7344944130a82801d192e31c32fa"
STATIC_UID = "3a1e9c0d5b7f4e2a8c6d0b9f1e3a5c7d"  # a static pod's: the hash of its manifest
needs_pods = pytest.mark.skipif(why_not() is not None, reason=why_not() or "")


# --- the cgroup shapes -------------------------------------------------------------------------------

def _kube(runtime, qos="burstable", uid=UID, cid=CID):
    return {"runtime": runtime, "id": cid, "pod_uid": uid, "qos": qos}


@pytest.mark.parametrize("line,want", [
    # systemd driver: the UID's dashes are underscores in the slice name
    ("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{}.scope".format(
        UID.replace("-", "_"), CID), _kube("containerd")),
    ("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/crio-{}.scope".format(
        UID.replace("-", "_"), CID), _kube("cri-o", "besteffort")),
    ("0::/kubepods.slice/kubepods-pod{}.slice/cri-containerd-{}.scope".format(UID.replace("-", "_"), CID),
     _kube("containerd", "guaranteed")),
    ("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/docker-{}.scope".format(
        UID.replace("-", "_"), CID), _kube("docker")),  # cri-dockerd
    # cgroupfs driver: containerd's container cgroup is the bare id; CRI-O's is crio-<id>
    ("0::/kubepods/burstable/pod{}/{}".format(UID, CID), _kube("cri")),
    ("0::/kubepods/besteffort/pod{}/{}".format(UID, CID), _kube("cri", "besteffort")),
    ("0::/kubepods/pod{}/{}".format(UID, CID), _kube("cri", "guaranteed")),
    ("0::/kubepods/burstable/pod{}/crio-{}".format(UID, CID), _kube("cri-o")),
    ("0::/kubepods/burstable/pod{}/{}".format(STATIC_UID, CID), _kube("cri", uid=STATIC_UID)),
    # kind (kubelet --cgroup-root=/kubelet) and a cgroup namespace's nesting: the shape is searched, not anchored
    ("0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-"
     "pod{}.slice/cri-containerd-{}.scope".format(UID.replace("-", "_"), CID), _kube("containerd", "besteffort")),
    # a hybrid v1/v2 host: the pod only in the v1 lines
    ("12:memory:/kubepods/burstable/pod{}/{}\n4:pids:/kubepods/burstable/pod{}/{}\n0::/".format(UID, CID, UID, CID),
     _kube("cri")),
    # conmon's own scope is the monitor's, beside the container: the pod's, with no container id
    ("0::/kubepods.slice/kubepods-pod{}.slice/crio-conmon-{}.scope".format(UID.replace("-", "_"), CID),
     {"runtime": "kubernetes", "id": UID, "pod_uid": UID, "qos": "guaranteed"}),
])
def test_kubelet_cgroup_shapes(line, want):
    assert procfs.parse_cgroup(line + "\n")[1] == want


@pytest.mark.parametrize("line,want", [
    ("0::/system.slice/docker-{}.scope".format(CID), {"runtime": "docker", "id": CID}),
    ("0::/docker/{}".format(CID), {"runtime": "docker", "id": CID}),
    ("0::/machine.slice/libpod-{}.scope".format(CID), {"runtime": "podman", "id": CID}),
    ("0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{}.scope/container".format(CID),
     {"runtime": "podman", "id": CID}),  # rootless, with the container's own init sub-cgroup
    ("0::/libpod_parent/libpod-{}".format(CID), {"runtime": "podman", "id": CID}),
    ("0::/system.slice/nerdctl-{}.scope".format(CID), {"runtime": "containerd", "id": CID}),
    ("0::/machine.slice/libpod-conmon-{}.scope".format(CID), None),  # podman's monitor, not a container
    ("0::/system.slice/containerd.service", None),
])
def test_container_runtime_cgroup_shapes(line, want):
    assert procfs.parse_cgroup(line + "\n")[1] == want


@pytest.mark.parametrize("argv,want", [
    (["/usr/bin/containerd-shim-runc-v2", "-namespace", "k8s.io", "-id", CID, "-address", "/run/c.sock"], "containerd"),
    (["/usr/bin/containerd-shim-runc-v2", "-namespace", "moby", "-id", CID], "docker"),
    (["containerd-shim", "-namespace", "moby", "-workdir", "/x"], "docker"),  # the v1 shim
    (["/usr/bin/conmon", "-b", "/run/x", "-c", CID, "-l", "/var/log/pods/a_b_c/d/0.log"], "cri-o"),
    (["/sbin/init"], None),
    ([], None),
])
def test_the_runtime_named_by_its_shim(argv, want):
    assert procfs.shim_runtime(argv) == want


# --- the kubelet's log layout ---------------------------------------------------------------------

def _layout(root: Path, namespace="inference", pod="llama-0", container="vllm", uid=UID, cid=CID, restart=0,
            link=True) -> Path:
    folder = root / "var" / "log" / "pods" / "{}_{}_{}".format(namespace, pod, uid) / container
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "{}.log".format(restart)).touch()
    if link:
        links = root / "var" / "log" / "containers"
        links.mkdir(parents=True, exist_ok=True)
        (links / "{}_{}_{}-{}.log".format(pod, namespace, container, cid)).symlink_to(
            "/var/log/pods/{}_{}_{}/{}/{}.log".format(namespace, pod, uid, container, restart))
    return folder


def test_pod_names_from_the_containers_link(tmp_path):
    _layout(tmp_path)
    _layout(tmp_path, container="sidecar", cid="f" * 64)
    got = pods.describe(str(tmp_path), _kube("containerd"))
    assert got == dict(_kube("containerd"), namespace="inference", pod="llama-0", name="vllm")
    assert pods.from_container(got).log_dir == "/var/log/pods/inference_llama-0_{}/vllm".format(UID)


def test_a_link_to_another_pods_folder_is_not_taken(tmp_path):
    """The link's container id matches but its folder is another pod's UID: the cgroup's UID decides."""
    _layout(tmp_path, uid="0" * 8 + UID[8:])
    assert pods.describe(str(tmp_path), _kube("containerd")) == _kube("containerd")


def test_pod_names_from_the_pods_folder_without_a_link(tmp_path):
    _layout(tmp_path, link=False)
    assert pods.describe(str(tmp_path), _kube("cri-o")) == dict(_kube("cri-o"), namespace="inference",
                                                                pod="llama-0", name="vllm")
    _layout(tmp_path, container="sidecar", link=False)  # two containers, nothing says which: no name
    assert pods.describe(str(tmp_path), _kube("cri-o")) == dict(_kube("cri-o"), namespace="inference",
                                                                pod="llama-0")


def test_a_container_outside_kubernetes_is_left_as_it_is(tmp_path):
    _layout(tmp_path)
    assert pods.describe(str(tmp_path), {"runtime": "docker", "id": CID}) == {"runtime": "docker", "id": CID}


def test_log_files_current_then_rotated_newest_first(tmp_path):
    folder = _layout(tmp_path, restart=2)
    for name in ("0.log", "1.log", "1.log.20260501-100000.gz", "2.log.20260501-120000.gz", "2.log.20260501-130000",
                 "2.log.20260501-110000.gz", "notes.txt"):
        (folder / name).touch()
    files = pods.log_files(str(tmp_path), "/var/log/pods/inference_llama-0_{}/vllm".format(UID))
    base = "/var/log/pods/inference_llama-0_{}/vllm/".format(UID)
    assert files.restart == 2
    assert files.files == tuple(base + x for x in ("2.log", "2.log.20260501-130000", "2.log.20260501-120000.gz",
                                                   "2.log.20260501-110000.gz"))
    assert files.previous == base + "1.log"


@pytest.mark.parametrize("spec,want", [
    ("k8s:inference/llama-0", ("k8s", "inference/llama-0")),
    ("k8s:inference/llama-0.shard-1/vllm", ("k8s", "inference/llama-0.shard-1/vllm")),
])
def test_k8s_log_spec(spec, want):
    assert engine_logs.parse_spec(spec) == want


@pytest.mark.parametrize("spec", ["k8s:", "k8s:inference", "k8s:../etc/passwd", "k8s:inference/../x",
                                  "k8s:Inference/llama", "k8s:-n/llama", "k8s:inference/llama-*", "k8s:a/b/c/d",
                                  "k8s:inference/llama/$(touch owned)", "k8s:inference//vllm", "k8s:a_b/c",
                                  "k8s:" + "a" * 64 + "/pod"])
def test_k8s_log_spec_refuses_what_kubernetes_would(spec):
    with pytest.raises(engine_logs.LogSpecError):
        engine_logs.parse_spec(spec)


@pytest.mark.parametrize("value", ["k8s:../x", "k8s:ns/pod/$(touch owned)", "k8s:-o/x"])
def test_a_bad_k8s_log_spec_is_a_usage_error(value, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["inspect", "--log", value])
    assert code == 2 and "k8s:NAMESPACE/POD[/CONTAINER]" in err and not (tmp_path / "owned").exists()


# --- reading the container's CRI log -----------------------------------------------------------------

VLLM_LOG = (ROOT / "tests" / "fixtures" / "fake_vllm" / "v1-0.27-tp2.log").read_text().format(
    server=1, core=2, tp0=3, tp1=4, port=8000)
SERVING = "(APIServer pid=1) INFO 11-30 10:00:00 [loggers.py:123] Engine 000: Avg prompt throughput: 0.0 tokens/s\n"


def _cri(text: str) -> bytes:
    """Whole lines as CRI records (F). Split (P) records: tests/test_logfile.py, tests/test_shipping.py."""
    return b"".join(cri_record(line.encode()) for line in text.splitlines())


def _version(section) -> str:
    return next(raw for _, _, raw in section["lines"] if "Initializing a V1 LLM engine" in raw).split("(v")[1][:6]


def test_the_current_containers_file_after_a_restart(tmp_path):
    """Restart 1: 0.log is the previous container's (another startup), 1.log the running one's."""
    folder = _layout(tmp_path, restart=1)
    (folder / "0.log").write_bytes(_cri(VLLM_LOG.replace("(v0.27.0)", "(v0.20.0)")))
    (folder / "1.log").write_bytes(_cri(VLLM_LOG))
    s = engine_logs.collect(("k8s", "inference/llama-0/vllm"), root=str(tmp_path), engine="vllm")
    assert s["status"] == "ok" and s["source"] == "k8s:inference/llama-0/vllm" and _version(s) == "0.27.0"
    assert s["notes"][0] == "k8s:inference/llama-0/vllm: read /var/log/pods/inference_llama-0_{}/vllm/1.log " \
        "(container restart 1)".format(UID)


def test_a_startup_rotated_out_of_the_current_file(tmp_path):
    """A long-running engine: N.log holds only serving lines; the startup is in a gzipped rotation."""
    folder = _layout(tmp_path)
    (folder / "0.log").write_bytes(_cri(SERVING * 3))
    (folder / "0.log.20260501-120000").write_bytes(_cri(SERVING * 3))
    with gzip.open(str(folder / "0.log.20260501-110000.gz"), "wb") as f:
        f.write(_cri(VLLM_LOG + SERVING))
    s = engine_logs.collect(("k8s", "inference/llama-0"), root=str(tmp_path), engine="vllm")
    assert s["status"] == "ok" and _version(s) == "0.27.0"
    assert "0.log.20260501-110000.gz (container restart 0; rotated out of the current file)" in s["notes"][0]


def test_found_from_the_process_and_no_startup_names_the_previous_container(tmp_path):
    folder = _layout(tmp_path, restart=1)
    (folder / "0.log").write_bytes(_cri(VLLM_LOG))
    (folder / "1.log").write_bytes(_cri(SERVING))
    container = pods.describe(str(tmp_path), _kube("containerd"))
    spec, why = engine_logs.spec_for({"pid": 7, "stdout": "pipe", "container": container})
    assert why is None and spec == ("cri", "/var/log/pods/inference_llama-0_{}/vllm".format(UID))
    s = engine_logs.collect(spec, root=str(tmp_path), engine="vllm")
    assert s["status"] == "failed" and s["source"] == "k8s:inference/llama-0/vllm"
    message = s["problems"][0]["message"]
    assert s["problems"][0]["code"] == "engine_log.no_startup"
    assert "the previous container's log is /var/log/pods/inference_llama-0_{}/vllm/0.log".format(UID) in message


def test_a_pod_with_several_containers_needs_one_named(tmp_path):
    _layout(tmp_path)
    _layout(tmp_path, container="sidecar", cid="f" * 64)
    s = engine_logs.collect(("k8s", "inference/llama-0"), root=str(tmp_path))
    assert s["status"] == "failed" and "logs 2 containers (sidecar, vllm)" in s["problems"][0]["message"]
    s = engine_logs.collect(("k8s", "inference/llama-1/vllm"), root=str(tmp_path))
    assert "no log folder /var/log/pods/inference_llama-1_<uid>" in s["problems"][0]["message"]


@pytest.mark.parametrize("server,want", [
    ({"pid": 7, "stdout": "pipe", "container": {"runtime": "docker", "id": CID}}, ("docker", CID[:12])),
    ({"pid": 7, "stdout": "tty", "container": {"runtime": "podman", "id": CID}}, ("podman", CID[:12])),
    # a file inside the container is the container's path: the host reads it through /proc/PID/root
    ({"pid": 7, "stdout": "file:/logs/server.log", "container": {"runtime": "podman", "id": CID}},
     ("file", "/proc/7/root/logs/server.log")),
    ({"pid": 7, "stdout": "pipe", "container": _kube("containerd")}, None),  # the layout does not name it
])
def test_where_a_containers_engine_writes(server, want):
    spec, why = engine_logs.spec_for(server)
    assert spec == want
    if want is None:
        assert "pass --log k8s:NAMESPACE/POD/CONTAINER" in why


def test_podman_logs(tmp_path, monkeypatch):
    """No podman here: a stand-in prints what ``podman logs`` would."""
    tool = tmp_path / "podman"
    tool.write_text("#!/bin/sh\ncat {}\n".format(ROOT / "examples" / "kimi-k2.5-tp8-eagle3.log"))
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", "{}:{}".format(tmp_path, os.environ["PATH"]))
    s = engine_logs.collect(("podman", CID[:12]))
    assert s["status"] == "ok" and s["source"] == "podman:" + CID[:12] and s["lines"]


# --- real processes in real cgroups --------------------------------------------------------------------

def _in_pod(node: Node, pod: Pod, program: str, netns_too: bool = False) -> subprocess.Popen:
    """A process the pod's shim starts in its container (tests/kubelet_shim.py)."""
    config = {"cgroup_procs": str(node.cgroup_dir(pod) / "cgroup.procs"), "log": str(node.log_file(pod)),
              "netns": netns_too, "argv": [sys.executable, "-c", program], "python": sys.executable}
    return subprocess.Popen(pod.shim_argv(), executable=sys.executable, env=dict(os.environ, KVF_SHIM=json.dumps(
        config)), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True)


def _child_of(pid: int, deadline_s: float = 20) -> int:
    deadline = time.time() + deadline_s
    while time.time() < deadline:
        for name in os.listdir("/proc"):
            try:
                if name.isdigit() and procfs.process("/", int(name))["ppid"] == pid:
                    return int(name)
            except (TypeError, KeyError):
                continue
        time.sleep(0.05)
    raise AssertionError("the shim started nothing")


def _stop(shim: subprocess.Popen) -> None:
    os.killpg(shim.pid, 9)
    shim.wait(timeout=10)


@needs_pods
@pytest.mark.parametrize("driver,runtime,qos", [("cgroupfs", "containerd", "burstable"),
                                                ("cgroupfs", "cri-o", "guaranteed"),
                                                ("systemd", "containerd", "besteffort"),
                                                ("systemd", "cri-o", "burstable")])
def test_a_process_in_a_kubelet_cgroup(tmp_path, driver, runtime, qos):
    """The cgroup gives the container id, pod UID and QoS; the runtime comes from the cgroup's name, or
    (containerd under cgroupfs names none) from the shim the container's process descends from."""
    with Node(tmp_path) as node:
        pod = node.add(Pod("inference", "llama-0", "vllm", driver=driver, runtime=runtime, qos=qos))
        shim = _in_pod(node, pod, "import time; time.sleep(600)")
        try:
            container = procfs.process("/", _child_of(shim.pid))["container"]
        finally:
            _stop(shim)
    assert container == {"runtime": runtime, "id": pod.container_id, "pod_uid": pod.uid, "qos": qos}


# --- HTTP in the container's network namespace -------------------------------------------------------

SERVER = textwrap.dedent('''
    import http.server, sys
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = sys.argv[2].encode()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)
        def log_message(self, *a):
            pass
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
''')


@pytest.fixture
def decoy():
    with kubelet.decoy() as port:
        yield port


def _serving_in_netns(port: int, body: str) -> subprocess.Popen:
    """A real HTTP server in a network namespace made with ``unshare --net`` (loopback up), reachable only there."""
    from tests.kubelet_shim import LO_UP

    return subprocess.Popen(["unshare", "--net", "--", sys.executable, "-c", LO_UP, sys.executable, "-c", SERVER,
                             str(port), body], stdout=subprocess.DEVNULL, start_new_session=True)


def _wait_listening(pid: int, port: int) -> None:
    """Until the process has its own namespace (before ``unshare`` runs it shares the host's, where the
    decoy listens) and listens there."""
    deadline = time.time() + 20
    while time.time() < deadline:
        if netns.foreign_namespace("/", pid) is None:
            time.sleep(0.05)
            continue
        with open("/proc/{}/net/tcp".format(pid)) as f:  # the namespace's own table
            if any(":{:04X} 00000000:0000 0A".format(port) in line for line in f):
                return
        time.sleep(0.05)
    raise AssertionError("nothing listens on {} in PID {}'s namespace".format(port, pid))


@needs_pods
def test_a_request_in_another_network_namespace(decoy):
    proc = _serving_in_netns(decoy, "vllm:num_requests_running 21\n")
    try:
        _wait_listening(proc.pid, decoy)
        theirs = netns.namespace_of("/", proc.pid)
        assert netns.foreign_namespace("/", proc.pid) == theirs != netns.namespace_of("/", os.getpid())
        assert netns.foreign_namespace("/", os.getpid()) is None
        from kvforensics.collectors import loopback

        url = "http://127.0.0.1:{}/metrics".format(decoy)
        assert netns.call_in("/", proc.pid, lambda: loopback.get(url)) == b"vllm:num_requests_running 21\n"
        assert loopback.get(url) == kubelet.DECOY_METRICS  # this thread never left the host's
        s = engine_http.collect({"port": decoy}, "vllm", pid=proc.pid)
    finally:
        _stop(proc)
    assert s["metrics"]["vllm:num_requests_running"] == 21
    assert s["status"] == "ok" and s["network_namespace"] == theirs and s["url"] == "http://127.0.0.1:{}".format(decoy)
    with pytest.raises(netns.NamespaceError):
        netns.call_in("/", proc.pid, lambda: None)  # gone: no namespace to enter


@needs_pods
def test_a_namespace_that_cannot_be_entered_is_not_asked_on_the_hosts_loopback(decoy):
    """Without CAP_SYS_ADMIN setns fails: the host's loopback (the decoy, another pod's engine) must not
    stand in for the pod's, and the problem says why."""
    proc = _serving_in_netns(decoy, "vllm:num_requests_running 21\n")
    program = ("import json; from kvforensics.collectors import engine_http; "
               "print(json.dumps(engine_http.collect({{'port': {}}}, 'vllm', pid={})))".format(decoy, proc.pid))
    try:
        _wait_listening(proc.pid, decoy)
        out = subprocess.run(["setpriv", "--bounding-set", "-sys_admin", "--inh-caps", "-sys_admin", "--",
                              sys.executable, "-c", program], cwd=str(ROOT), stdout=subprocess.PIPE, check=True,
                             universal_newlines=True).stdout
    finally:
        _stop(proc)
    s = json.loads(out)
    assert s["metrics"] == {} and s["status"] == "absent"
    assert [p["code"] for p in s["problems"]] == ["engine_http.other_namespace"]
    assert "Operation not permitted" in s["problems"][0]["message"]


def test_the_loopback_of_a_fixture_tree_is_this_ones(tmp_path):
    """A /proc that does not say (a fixture tree, another user's process): this namespace, as before."""
    assert netns.foreign_namespace(str(tmp_path), 1) is None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    got = engine_http.collect({"port": port}, "vllm", pid=1, root=str(tmp_path))
    assert got["network_namespace"] is None and got["problems"][0]["code"] == "engine_http.unreachable"
