"""The container image (deploy/kubernetes/Containerfile), where a builder is at hand: built from the sdist
with no registry and no index, run offline on a read-only root, and run as the DaemonSet runs it (the
host's PIDs, every capability dropped but the one it names, its arguments and environment) against the
fake node, whose processes are the host's; and without that capability, to show what it is for.

Skipped unless podman (or docker with a daemon) is installed AND a Python base image and a folder of the
dependencies' wheels are named (KVFORENSICS_TEST_PYTHON_IMAGE, KVFORENSICS_TEST_WHEELHOUSE): a test never
pulls from a registry. A builder that needs options here (a VM without cgroup v2, rlimits it may not
raise) takes them from KVFORENSICS_TEST_BUILD_OPTIONS (replacing the default "--network none") and
KVFORENSICS_TEST_CONTAINER_OPTIONS (before "run"), README "On Kubernetes"."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest

from tests.conftest import ROOT
from tests.fakenode import FAKE_LIB, FakeNode, build_fake_nvml
from tests.test_kubernetes import K8S, _container, _pod, _version

INPUTS = ("KVFORENSICS_TEST_PYTHON_IMAGE", "KVFORENSICS_TEST_WHEELHOUSE")
# Lowered, never raised: a runtime may not raise them inside a VM, and kvforensics needs few of either.
ULIMITS = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]


def _runner() -> str:
    if shutil.which("podman"):
        return "podman"
    if shutil.which("docker") and subprocess.run(["docker", "info"], capture_output=True).returncode == 0:
        return "docker"
    return ""


def _skip_reason() -> str:
    if not _runner():
        return "no container builder here (podman, or docker with a daemon)"
    if not all(os.environ.get(k) for k in INPUTS):
        return ("set KVFORENSICS_TEST_PYTHON_IMAGE (a Python base image on this machine) and "
                "KVFORENSICS_TEST_WHEELHOUSE (the dependencies' wheels): a test never pulls from a registry")
    return ""


pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(_skip_reason()), reason=_skip_reason() or "-")]


def _container_cmd() -> List[str]:
    return [_runner()] + shlex.split(os.environ.get("KVFORENSICS_TEST_CONTAINER_OPTIONS", ""))


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> Iterator[str]:
    """The image, built from an sdist of this tree beside the wheelhouse, pip with --no-index."""
    context = tmp_path_factory.mktemp("image") / "context"
    shutil.copytree(os.environ["KVFORENSICS_TEST_WHEELHOUSE"], str(context))
    code = "from setuptools import build_meta; print(build_meta.build_sdist({!r}))".format(str(context))
    done = subprocess.run([sys.executable, "-c", code], cwd=str(ROOT), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    tag = "localhost/kvforensics-test:{}".format(os.getpid())
    options = shlex.split(os.environ.get("KVFORENSICS_TEST_BUILD_OPTIONS", "--network none"))
    build = _container_cmd() + ["build", "-f", str(K8S / "Containerfile"), "--build-arg",
                                "VERSION={}".format(_version()), "--build-arg",
                                "PYTHON_IMAGE={}".format(os.environ["KVFORENSICS_TEST_PYTHON_IMAGE"]),
                                "--build-arg", "PIP_OPTIONS=--no-index --find-links /src"] + options + [
        "-t", tag, str(context)]
    done = subprocess.run(build, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    yield tag
    subprocess.run(_container_cmd() + ["rmi", "-f", tag], capture_output=True)


def test_the_image_runs_offline_on_a_read_only_root(image):
    for argv, expected in ((["--version"], "kvforensics {}".format(_version())),
                           (["deploy-files", "--print"], "# ==> kubernetes/daemonset.yaml <==")):
        run = subprocess.run(_container_cmd() + ["run", "--rm", "--network", "none", "--read-only"] + ULIMITS
                             + [image] + argv, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0 and expected in run.stdout, run.stderr


def _daemonset_flags(caps: List[str]) -> List[str]:
    """The DaemonSet's pod and container settings as run flags (caps: the capabilities added)."""
    pod, c = _pod(), _container()
    sc, psc = c["securityContext"], pod["securityContext"]
    flags = ["--pid", "host"] if pod["hostPID"] else []
    flags += ["--read-only"] if sc["readOnlyRootFilesystem"] else []
    flags += ["--security-opt", "no-new-privileges"] if not sc["allowPrivilegeEscalation"] else []
    flags += ["--user", "{}:{}".format(psc["runAsUser"], psc["runAsGroup"]), "--tmpfs", "/tmp"]
    flags += ["--cap-drop", "ALL"] if sc["capabilities"]["drop"] == ["ALL"] else []
    for cap in caps:
        flags += ["--cap-add", cap]
    for e in c["env"]:
        flags += ["-e", "{}={}".format(e["name"], e["value"])]
    return flags


def _serve_in_container(image: str, node: FakeNode, history: Path, caps: List[str]) -> Tuple[int, str, str, str]:
    """(exit code after SIGTERM, /metrics, /healthz, stderr) of the DaemonSet's command in the image, on the
    host's network (the test has no pod network) at a free loopback port."""
    args = list(_container()["args"])
    args[args.index("--listen") + 1] = "127.0.0.1:0"
    name = "kvforensics-test-{}-{}".format(os.getpid(), len(caps))
    mounts = ["-v", "{}:/fake/libnvidia-ml.so.1:ro".format(FAKE_LIB), "-v", "{0}:{0}:ro".format(node.dir),
              "-v", "{}:/var/lib/kvforensics".format(history)]
    cmd = (_container_cmd() + ["run", "--rm", "--name", name, "--network", "host"] + ULIMITS + _daemonset_flags(caps)
           + mounts + ["-e", "FAKE_NVML_SCENARIO={}".format(node.scenario), image] + args
           + ["--nvml-lib", "/fake/libnvidia-ml.so.1", "--no-http"])
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        assert "listening on " in line, line + proc.stderr.read()
        url = line.split("listening on ", 1)[1].split(" ", 1)[0]
        got: Dict[str, str] = {}
        for path in ("/metrics", "/healthz"):
            with urllib.request.urlopen(url + path, timeout=60) as r:
                got[path] = r.read().decode()
    finally:
        subprocess.run(_container_cmd() + ["kill", "--signal", "TERM", name], capture_output=True)
        code = proc.wait(timeout=120)
    return code, got["/metrics"], got["/healthz"], line + proc.stderr.read()


def test_the_image_serves_the_node_with_the_daemonsets_privileges(image, tmp_path):
    build_fake_nvml()
    history = tmp_path / "history"
    history.mkdir()
    with FakeNode(tmp_path / "node") as node:
        code, metrics, health, err = _serve_in_container(image, node, history,
                                                         _container()["securityContext"]["capabilities"]["add"])
    assert code == 0 and err.rstrip().endswith("kvforensics serve: stopped"), err
    assert health.startswith("ok: ")
    # the engine, its ranks and its log (read through /proc/PID/fd of the host's processes) were all found
    assert 'kvforensics_engine_kv_pool_bytes{engine="sglang-1",rank="TP7"}' in metrics
    assert "engine_log_missing" not in metrics
    assert (history / "history.db").is_file()  # the history on the node's path


def test_without_sys_ptrace_the_engines_log_is_not_found(image, tmp_path):
    """Why the DaemonSet adds SYS_PTRACE: the engine's /proc/PID/fd is closed to a process with fewer
    capabilities than the engine, root or not."""
    build_fake_nvml()
    history = tmp_path / "history"
    history.mkdir()
    with FakeNode(tmp_path / "node") as node:
        code, metrics, health, err = _serve_in_container(image, node, history, [])
    assert code == 0
    assert 'kvforensics_findings{code="engine_log_missing",severity="warning"} 1.0' in metrics
    assert "kvforensics_engine_kv_pool_bytes" not in metrics
