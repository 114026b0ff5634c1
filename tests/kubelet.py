"""A Kubernetes node's kubelet and container runtime, made of real parts, for the pod tests.

No API server, kubelet or containerd can run here; what kvforensics reads of them is made for real:
* cgroups shaped as the kubelet makes them, with either cgroup driver, in the real cgroup v2
  hierarchy (under a uniquely named parent, removed afterwards);
* a container shim (``tests/kubelet_shim.py``, its command line a containerd shim's or conmon's) that
  starts the container's process in that cgroup, in a network namespace of its own made with
  ``unshare --net`` (loopback up), its stdout a pipe the shim writes to the CRI log file;
* the log layout: ``<log root>/pods/<ns>_<pod>_<uid>/<container>/<N>.log`` and the
  ``<log root>/containers/<pod>_<ns>_<container>-<id>.log`` link (absolute, as the kubelet makes it).
kvforensics reads /var/log: ``run_in_node`` runs it in a private mount namespace where the log root is
bind-mounted on /var/log (``python -m tests.kubelet LOG_ROOT ARGS…`` is that namespace's entry point),
so the product has no test hook and the host's /var/log is never touched.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

from tests.fakenode import ROOT, FakeVllmNode
from tests.kubelet_shim import record as cri_record
from tests.loopback_http import serving

__all__ = ["DECOY_METRICS", "Node", "Pod", "PodVllmNode", "cri_record", "decoy", "merge_scenarios", "run_in_node",
           "why_not"]

SHIM = ROOT / "tests" / "kubelet_shim.py"
CGROUP_PREFIX = "kvf-test-"


def _cgroup2_mount() -> Optional[Path]:
    with open("/proc/self/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) > 2 and parts[2] == "cgroup2":
                return Path(parts[1])
    return None


def _own_cgroup2() -> str:
    with open("/proc/self/cgroup") as f:
        for line in f:
            if line.startswith("0::"):
                return line[3:].strip()
    return "/"


def cgroup2_root() -> Optional[Path]:
    """Where this process's cgroup v2 sits (a pure v2 host: /sys/fs/cgroup; hybrid: …/unified)."""
    mount = _cgroup2_mount()
    return None if mount is None else mount / _own_cgroup2().lstrip("/")


def why_not() -> Optional[str]:
    """Why pods cannot be made here (a skip reason), or None."""
    if os.geteuid() != 0:
        return "needs root (cgroups, network and mount namespaces)"
    for tool in ("unshare", "mount"):
        if shutil.which(tool) is None:
            return "needs {}".format(tool)
    root = cgroup2_root()
    if root is None or not os.access(str(root), os.W_OK):
        return "needs a writable cgroup v2 hierarchy"
    return None


@dataclass(frozen=True)
class Pod:
    """One pod with one container, as the kubelet and its runtime place it."""

    namespace: str
    name: str
    container: str
    driver: str = "systemd"  # the kubelet's cgroup driver: "systemd" | "cgroupfs"
    runtime: str = "containerd"  # "containerd" | "cri-o"
    qos: str = "burstable"  # "burstable" | "besteffort" | "guaranteed"
    restart: int = 0  # the container's restart count: its log is <restart>.log
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    container_id: str = field(default_factory=lambda: secrets.token_hex(32))

    @property
    def log_dir(self) -> str:
        """The node's path of the container's log folder."""
        return "/var/log/pods/{}_{}_{}/{}".format(self.namespace, self.name, self.uid, self.container)

    def cgroup(self) -> str:
        """The container's cgroup below the node's root, as the kubelet and runtime name it."""
        qos = "" if self.qos == "guaranteed" else self.qos
        if self.driver == "cgroupfs":
            # containerd names the container's cgroup by its bare id; CRI-O prefixes "crio-"
            leaf = self.container_id if self.runtime == "containerd" else "crio-" + self.container_id
            return "/".join(x for x in ("kubepods", qos, "pod" + self.uid, leaf) if x)
        prefix = "kubepods-" + qos if qos else "kubepods"
        leaf = "{}-{}.scope".format("cri-containerd" if self.runtime == "containerd" else "crio", self.container_id)
        slices = ["kubepods.slice"] + (["kubepods-{}.slice".format(qos)] if qos else [])
        return "/".join(slices + ["{}-pod{}.slice".format(prefix, self.uid.replace("-", "_")), leaf])

    def shim_argv(self) -> List[str]:
        """The command line of the runtime's per-container process (what ``ps`` shows on a node)."""
        if self.runtime == "containerd":
            return ["/usr/bin/containerd-shim-runc-v2", str(SHIM), "-namespace", "k8s.io", "-id", self.container_id,
                    "-address", "/run/containerd/containerd.sock"]
        return ["/usr/bin/conmon", str(SHIM), "-c", self.container_id, "-n",
                "k8s_{}_{}_{}_{}_{}".format(self.container, self.name, self.namespace, self.uid, self.restart),
                "-l", "{}/{}.log".format(self.log_dir, self.restart)]


class Node:
    """The node's side: a unique cgroup parent and a /var/log-shaped folder. ``close`` removes the cgroups."""

    def __init__(self, workdir: Path) -> None:
        root = cgroup2_root()
        assert root is not None
        self.cgroup_base = root / (CGROUP_PREFIX + secrets.token_hex(6))
        self.log_root = workdir / "var-log"
        (self.log_root / "pods").mkdir(parents=True, exist_ok=True)
        (self.log_root / "containers").mkdir(parents=True, exist_ok=True)
        self.cgroup_base.mkdir()
        self.pods: List[Pod] = []

    def __enter__(self) -> "Node":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add(self, pod: Pod) -> Pod:
        (self.cgroup_base / pod.cgroup()).mkdir(parents=True, exist_ok=True)
        self.on_disk(pod.log_dir).mkdir(parents=True, exist_ok=True)
        current = "{}/{}.log".format(pod.log_dir, pod.restart)
        self.on_disk(current).touch()
        link = self.log_root / "containers" / "{}_{}_{}-{}.log".format(pod.name, pod.namespace, pod.container,
                                                                       pod.container_id)
        link.symlink_to(current)  # absolute, as the kubelet makes it: valid where /var/log is the log root
        self.pods.append(pod)
        return pod

    def on_disk(self, node_path: str) -> Path:
        """Where a /var/log/… path of the node is in this test's folder."""
        assert node_path.startswith("/var/log/")
        return self.log_root / node_path[len("/var/log/"):]

    def log_file(self, pod: Pod) -> Path:
        return self.on_disk("{}/{}.log".format(pod.log_dir, pod.restart))

    def cgroup_dir(self, pod: Pod) -> Path:
        return self.cgroup_base / pod.cgroup()

    def close(self) -> None:
        """Remove the cgroups, leaves first, once their processes are gone."""
        dirs = sorted((p for p in self.cgroup_base.rglob("*") if p.is_dir()), key=lambda p: len(p.parts),
                      reverse=True) + [self.cgroup_base]
        for d in dirs:
            deadline = time.time() + 10
            while d.exists():
                try:
                    d.rmdir()
                except OSError:
                    if time.time() > deadline:
                        raise
                    time.sleep(0.05)


class PodVllmNode(FakeVllmNode):
    """tests/fakenode.py's fake vLLM server, started in a pod: in the pod's cgroup and its own network
    namespace, its stdout a pipe to the shim that writes the CRI log. ``port`` is the port inside the
    pod (required: the test holds a decoy on the same port on the host)."""

    def __init__(self, workdir: Path, node: Node, pod: Pod, **kwargs: Any) -> None:
        assert kwargs.get("port"), "a pod's engine listens on a port of its own namespace"
        super().__init__(workdir, **kwargs)
        self.node, self.pod = node, pod
        self.engine_pid = 0

    def spawn(self, argv: List[str], out: Any, env: Dict[str, str],
              pass_fds: Tuple[int, ...] = ()) -> subprocess.Popen:
        config = {"cgroup_procs": str(self.node.cgroup_dir(self.pod) / "cgroup.procs"),
                  "log": str(self.node.log_file(self.pod)), "netns": True, "argv": argv, "python": sys.executable}
        shim = self.pod.shim_argv()
        return subprocess.Popen(shim, executable=sys.executable, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, cwd=str(self.dir),
                                env=dict(env, KVF_SHIM=json.dumps(config)), start_new_session=True)

    def start(self) -> None:
        super().start()
        self.engine_pid = self.pids["server"]


def merge_scenarios(nodes: List[FakeVllmNode], path: Path) -> None:
    """One fake NVML scenario for several fake nodes on one machine: each node's GPUs after the previous
    node's, with their own UUIDs and bus ids (the driver lines once)."""
    out: List[str] = []
    offset = 0
    for number, node in enumerate(nodes):
        for line in node.scenario.read_text().splitlines():
            words = line.split()
            if words[0] not in ("gpu", "proc"):
                out += [line] if number == 0 else []
                continue
            index = int(words[1]) + offset
            words[1] = str(index)
            out.append(" ".join(_renumbered(w, index) for w in words))
        offset += node.tp
    path.write_text("\n".join(out) + "\n")


def _renumbered(word: str, index: int) -> str:
    if word.startswith("uuid="):
        return word[:-4] + "{:04x}".format(index)
    if word.startswith("bus="):
        return "bus=00000000:{:02X}:00.0".format(0x06 + index)
    return word


DECOY_METRICS = b"vllm:num_requests_running 99\nvllm:num_requests_waiting 99\n"


class _Decoy(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200)
        self.end_headers()
        self.wfile.write(DECOY_METRICS)

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def decoy() -> Iterator[int]:
    """A server on the host's loopback, on a free port the pods' engines then use in their own namespaces:
    a request made on the host's 127.0.0.1 instead of the pod's reads 99 running requests."""
    with serving(_Decoy) as port:
        yield port


def run_in_node(node: Node, argv: List[str], env: Dict[str, str]) -> subprocess.CompletedProcess:
    """kvforensics ARGV as a process of its own, in a private mount namespace where /var/log is the node's."""
    cmd = ["unshare", "--mount", "--propagation", "private", "--", sys.executable, "-m", "tests.kubelet",
           str(node.log_root)] + argv
    return subprocess.run(cmd, cwd=str(ROOT), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300,
                          universal_newlines=True)


def _main(args: List[str]) -> int:
    """Inside the private mount namespace: bind the log root on /var/log, then run kvforensics."""
    subprocess.run(["mount", "--bind", args[0], "/var/log"], check=True)
    from kvforensics.agent.cli import main

    return main(args[1:])


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
