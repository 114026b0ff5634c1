"""The shipped Kubernetes deployment (deploy/kubernetes/): every object valid offline against the
Kubernetes OpenAPI schemas that the kubernetes-validate package bundles (strict: an unknown field is an
error), the ServiceMonitor against the closed subset schema in tests/fixtures/kubernetes/ (the operator's
CRD is not vendored), the objects consistent with each other and with the README's privileges, and the
DaemonSet's own command run against the fake node. The image: tests/test_image.py."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any, Dict, List

import pytest

from tests.conftest import FIXTURES, ROOT, run_cli
from tests.fakenode import FAKE_LIB, FakeNode, build_fake_nvml

yaml = pytest.importorskip("yaml")
K8S = ROOT / "deploy" / "kubernetes"
# An older Kubernetes minor (what a cluster not upgraded lately runs) and the newest schema the package bundles.
KUBERNETES_VERSIONS = ("1.31", None)


def _version() -> str:
    for line in (ROOT / "pyproject.toml").read_text().splitlines():
        if line.startswith("version = "):
            return line.split('"')[1]
    raise AssertionError("no version in pyproject.toml")


def _objects() -> Dict[str, Dict[str, Any]]:
    """kind -> object, of every file the kustomization lists."""
    out = {}
    for name in _kustomization()["resources"]:
        for doc in yaml.safe_load_all((K8S / name).read_text()):
            assert doc["kind"] not in out, doc["kind"]
            out[doc["kind"]] = doc
    return out


def _kustomization() -> Dict[str, Any]:
    return yaml.safe_load((K8S / "kustomization.yaml").read_text())


def _pod() -> Dict[str, Any]:
    return _objects()["DaemonSet"]["spec"]["template"]["spec"]


def _container() -> Dict[str, Any]:
    (container,) = _pod()["containers"]
    return container


def test_the_kustomization_applies_every_manifest():
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(_kustomization()["resources"]) == files


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS, ids=lambda v: v or "latest")
def test_every_builtin_object_is_valid_for_kubernetes(version):
    import kubernetes_validate

    target = version or kubernetes_validate.latest_version()
    checked = []
    for kind, obj in _objects().items():
        if obj["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # a CRD: the next test
        kubernetes_validate.validate(obj, target, strict=True)
        checked.append(kind)
    assert sorted(checked) == ["DaemonSet", "Namespace", "Service", "ServiceAccount"]


def test_a_field_kubernetes_does_not_know_is_caught():
    """The validation is strict, so a misspelt field (silently dropped by the API server) fails here."""
    import kubernetes_validate

    ds = _objects()["DaemonSet"]
    ds["spec"]["template"]["spec"]["hostPid"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, kubernetes_validate.latest_version(), strict=True)


def test_the_servicemonitor_is_valid_against_its_schema():
    import jsonschema

    schema = json.loads((FIXTURES / "kubernetes" / "servicemonitor.schema.json").read_text())
    sm = _objects()["ServiceMonitor"]
    jsonschema.Draft202012Validator(schema).validate(sm)
    bad = json.loads(json.dumps(sm))
    bad["spec"]["endpoints"][0]["intervall"] = "30s"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(schema).validate(bad)
    (endpoint,) = sm["spec"]["endpoints"]
    # Prometheus refuses a scrape timeout longer than the interval
    assert _seconds(endpoint["scrapeTimeout"]) <= _seconds(endpoint["interval"])


def _seconds(duration: str) -> float:
    from kvforensics.agent.history.store import parse_duration

    return parse_duration(duration)


def test_the_objects_point_at_each_other():
    objs = _objects()
    ns = objs["Namespace"]["metadata"]["name"]
    for kind, obj in objs.items():
        if kind != "Namespace":
            assert obj["metadata"]["namespace"] == ns, kind
    ds, svc, sm = objs["DaemonSet"], objs["Service"], objs["ServiceMonitor"]
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["namespaceSelector"]["matchNames"] == [ns]
    assert _pod()["serviceAccountName"] == objs["ServiceAccount"]["metadata"]["name"]
    (port,) = _container()["ports"]
    (svc_port,) = svc["spec"]["ports"]
    assert svc_port["targetPort"] == port["name"] == sm["spec"]["endpoints"][0]["port"] == svc_port["name"]
    assert svc["spec"]["clusterIP"] == "None"  # each node's pod is its own target
    for probe in ("readinessProbe", "livenessProbe"):
        assert _container()[probe]["httpGet"] == {"path": "/healthz", "port": port["name"]}
    assert sm["spec"]["endpoints"][0]["path"] == "/metrics"


def _serve_params(args: List[str]) -> Dict[str, Any]:
    """The DaemonSet's arguments as the real CLI parses them (an unknown option fails here)."""
    import typer

    from kvforensics.agent.cli import app

    assert args[0] == "serve"
    command = typer.main.get_command(app).commands["serve"]  # type: ignore[attr-defined]
    return command.make_context("serve", list(args[1:])).params


def test_the_daemonset_runs_serve_as_documented():
    c = _container()
    params = _serve_params(c["args"])
    (port,) = c["ports"]
    assert params["listen"] == "0.0.0.0:{}".format(port["containerPort"])
    assert params["min_interval"] == "15s" and params["keep"] == "30d"
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in _pod()["volumes"]}
    # the history lives on the node, at the path --db names
    assert os.path.dirname(params["db"]) == mounts["history"]["mountPath"] == volumes["history"]["hostPath"]["path"]
    assert c["image"] == "kvforensics:{}".format(_version())


def test_the_privileges_are_the_documented_ones():
    pod, c = _pod(), _container()
    assert pod["hostPID"] is True
    assert not pod.get("hostNetwork") and not pod.get("hostIPC")
    assert pod["automountServiceAccountToken"] is False
    sc = c["securityContext"]
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"]
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYS_PTRACE"]}
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env == {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "utility"}
    assert "nvidia.com/gpu" not in json.dumps(c["resources"])  # no GPU taken from the engines
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    host_paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    for path in ("/var/log/pods", "/var/log/containers"):
        assert mounts[path]["readOnly"] is True
        assert host_paths[mounts[path]["name"]] == path  # same path: the symlinks resolve inside the pod
    writable = {m["mountPath"] for m in c["volumeMounts"] if not m.get("readOnly")}
    assert writable == {"/var/lib/kvforensics", "/tmp"}
    assert "limits" not in c["resources"] or "memory" not in c["resources"]["limits"]


def test_the_containerfile_builds_this_version_from_the_sdist():
    text = (K8S / "Containerfile").read_text()
    assert text.count("ARG VERSION={}\n".format(_version())) == 2
    assert "pip wheel" in text and "--no-index" in text  # the image installs what the build stage made
    (port,) = _container()["ports"]
    assert 'CMD ["serve", "--listen", "0.0.0.0:{}"]'.format(port["containerPort"]) in text


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed (kustomize is inside it)")
def test_kubectl_kustomize_renders_the_deployment():
    done = subprocess.run(["kubectl", "kustomize", str(K8S)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    kinds = [d["kind"] for d in yaml.safe_load_all(done.stdout)]
    assert sorted(kinds) == ["DaemonSet", "Namespace", "Service", "ServiceAccount", "ServiceMonitor"]


def test_deploy_files_writes_the_kubernetes_files_with_the_image(tmp_path):
    code, out, err = run_cli(["deploy-files", str(tmp_path), "--image", "registry.example/kvforensics:{}".format(
        _version())])
    assert code == 0, err
    written = tmp_path / "kubernetes"
    assert {p.name for p in written.iterdir()} == {p.name for p in K8S.iterdir()}
    ds = yaml.safe_load((written / "daemonset.yaml").read_text())
    assert ds["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example/kvforensics:{}".format(
        _version())
    assert (written / "service.yaml").read_text() == (K8S / "service.yaml").read_text()


def test_the_daemonsets_command_serves_the_fake_node(tmp_path):
    """The container's main process as the DaemonSet starts it, but for the address (here: a free
    loopback port, named on stderr) and the history (a temporary file); probed as the kubelet probes."""
    build_fake_nvml()
    args = list(_container()["args"])
    args[args.index("--listen") + 1] = "127.0.0.1:0"
    args[args.index("--db") + 1] = str(tmp_path / "history.db")
    with FakeNode(tmp_path / "node") as node:
        proc = subprocess.Popen([sys.executable, "-m", "kvforensics"] + args + ["--nvml-lib", str(FAKE_LIB),
                                                                                "--no-http"],
                                env=dict(node.env(), PYTHONPATH=str(ROOT)), cwd=str(ROOT), stderr=subprocess.PIPE,
                                text=True)
        try:
            url = proc.stderr.readline().split("listening on ", 1)[1].split(" ", 1)[0]
            probe = _container()["readinessProbe"]["httpGet"]["path"]
            with urllib.request.urlopen(url + probe, timeout=60) as r:
                assert r.status == 200
            with urllib.request.urlopen(url + "/metrics", timeout=60) as r:
                assert b'kvforensics_gpu_up{gpu="7"' in r.read()
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0


def test_deploy_files_lists_every_kubernetes_file():
    """What `deploy-files` writes (and looks for in an installation) is the whole folder."""
    from kvforensics.agent.cli.deploy_files import KUBERNETES_FILES

    assert {Path(n).name for n in KUBERNETES_FILES} == {p.name for p in K8S.iterdir()}
