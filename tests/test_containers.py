"""Containers and Kubernetes pods seen from the host: the runtime and container id from the cgroup, the
kubelet's pod from its cgroup shape and its log layout, the container's CRI log files, and HTTP inside
the container's network namespace.

Pure shapes are checked on strings and fixture trees; the rest on real processes in real cgroups and
real network namespaces (tests/kubelet.py), which need root: skipped without it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from collectors import pods, procfs
from tests.kubelet import Node, Pod, why_not

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
