"""End to end on one machine: an engine in a Kubernetes pod, found and explained from the host.

The engine is tests/fakenode.py's vLLM stand-in (an API server, its engine core and TP workers, a
startup log with their live PIDs, /metrics), started by a container shim (tests/kubelet.py) in a
cgroup shaped as the kubelet makes it, with either cgroup driver, in a network namespace of its own
made with ``unshare --net``, its stdout a pipe whose lines the shim writes as CRI records to
/var/log/pods. kvforensics runs as its own process in a private mount namespace where the test's
/var/log-shaped folder is bind-mounted on /var/log; the product has no test hook. On the host's
loopback, on the same port as the pod's engine, a decoy serves other numbers."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kvforensics.agent.model import evidence
from kvforensics.agent.model.live import Inspection
from kvforensics.agent.model.reconcile import inspect_snapshot
from kvforensics.agent.model.records import Options
from kvforensics.reports import prometheus
from tests.conftest import run_cli
from tests.fakenode import FAKE_LIB, build_fake_nvml
from tests.kubelet import Node, Pod, PodVllmNode, decoy, merge_scenarios, run_in_node, why_not

pytestmark = pytest.mark.skipif(why_not() is not None, reason=why_not() or "")
METRICS = Path(__file__).resolve().parent / "fixtures" / "vllm_metrics" / "v0.11.0_v1_dp2.prom"
POD_LABELS = {"namespace", "pod", "container"}


@pytest.fixture(scope="module", autouse=True)
def fake_lib():
    return build_fake_nvml()


def _kvf(node: Node, scenario: Path, *argv: str):
    run = run_in_node(node, list(argv) + ["--nvml-lib", str(FAKE_LIB)], dict(os.environ, FAKE_NVML_SCENARIO=str(
        scenario)))
    assert run.returncode in (0, 1), run.stderr
    return run


def _samples(text: str):
    """Series as Prometheus keys them: a label with an empty value is no label."""
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if v))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


@pytest.mark.parametrize("driver,runtime,qos", [("cgroupfs", "containerd", "burstable"),
                                                ("systemd", "containerd", "guaranteed"),
                                                ("systemd", "cri-o", "besteffort")])
def test_inspect_names_the_pod_and_reads_its_cri_log_and_its_metrics(tmp_path, driver, runtime, qos):
    with Node(tmp_path) as node, decoy() as port:
        pod = node.add(Pod("inference", "llama-70b-0", "vllm", driver=driver, runtime=runtime, qos=qos))
        with PodVllmNode(tmp_path / "n", node, pod, tp=2, port=port, metrics_text=METRICS.read_text()) as n:
            report = _kvf(node, n.scenario, "inspect", "--json")
            text = _kvf(node, n.scenario, "inspect", "--no-color", "--detail").stdout
            brief = _kvf(node, n.scenario, "inspect", "--no-color").stdout
            _kvf(node, n.scenario, "record", "--db", str(tmp_path / "h.db"), "--samples", "1",
                 "--prom-file", str(tmp_path / "kvf.prom"))
            pids = dict(n.pids)
    # the one-screen report names the pod among the node's facts, right under the verdict
    assert "pod inference/llama-70b-0 (container vllm)" in brief.split("evidence")[1].splitlines()[1]
    doc = json.loads(report.stdout)
    evidence.check("report", doc)
    t = doc["targets"][0]
    assert t["status"] == "ok", t["problems"]
    assert t["pod"] == {"namespace": "inference", "name": "llama-70b-0", "uid": pod.uid, "container": "vllm",
                        "qos": qos}
    # the startup, from the CRI log the shim wrote: its workers' live PIDs place them on the GPUs
    assert [r["rank"] for r in t["startup"]["ranks"]] == ["Worker_TP0 pid={}".format(pids["tp0"]),
                                                          "Worker_TP1 pid={}".format(pids["tp1"])]
    assert [(g["rank"], g["processes"][0]["pid"]) for g in t["gpus"]] == [("Worker_TP0", pids["tp0"]),
                                                                          ("Worker_TP1", pids["tp1"])]
    read = "k8s:inference/llama-70b-0/vllm: read /var/log/pods/inference_llama-70b-0_{}/vllm/0.log (container " \
        "restart 0)".format(pod.uid)
    assert {"code": "engine_log.reader", "message": read} in t["problems"]
    # the load, from /metrics inside the pod's namespace, not the decoy on the host's loopback
    live = next(f["detail"] for f in t["findings"] if f["code"] == "concurrency_bound")
    assert "Live (http://127.0.0.1:{}/metrics): running 21, waiting 4, KV cache usage 62%".format(port) in live
    assert "From the engine's startup log (k8s:inference/llama-70b-0/vllm):" in text
    samples = _samples((tmp_path / "kvf.prom").read_text())
    pod_labels = (("container", "vllm"), ("namespace", "inference"), ("pod", "llama-70b-0"))
    engine = ("engine", "vllm-{}".format(port))
    assert samples[("kvforensics_engine_kv_pool_tokens", tuple(sorted((engine,) + pod_labels)))] == 355200
    assert samples[("kvforensics_engine_kv_pool_bytes", tuple(sorted((engine, ("rank", "Worker_TP0")) + pod_labels)))]
    for (name, labels), _ in samples.items():
        keys = {k for k, _ in labels}
        if name.startswith("kvforensics_engine_") or "engine" in keys:
            assert POD_LABELS <= keys, name
        elif name.startswith(("kvforensics_gpu_memory_total", "kvforensics_host_", "kvforensics_collector_")):
            assert not POD_LABELS & keys, name  # node-level: whichever pod asks


def _inspection(snap: dict, selected: int) -> Inspection:
    chosen = dict(snap, engines=dict(snap["engines"], selected=selected))
    insp = inspect_snapshot(chosen, "bundle:two-pods", Options())
    assert isinstance(insp, Inspection)
    return insp


def _registry_samples(snap: dict, selected: int):
    """The textfile of the snapshot explained for its engine ``selected`` (what --engine PORT writes)."""
    return _samples(prometheus.render(prometheus.registry(prometheus.of_inspection(_inspection(snap, selected)))))


def test_two_pods_on_one_node_with_the_same_engine_and_port_do_not_collide(tmp_path):
    """Two teams' pods, each a vLLM on the same port in its own namespace: both found, each with its pod;
    their engine series differ by pod, the node's series are the same series."""
    with Node(tmp_path) as node, decoy() as port:
        a = node.add(Pod("team-a", "llama-0", "vllm", driver="systemd"))
        b = node.add(Pod("team-b", "llama-0", "vllm", driver="cgroupfs"))
        with PodVllmNode(tmp_path / "a", node, a, tp=2, port=port, metrics_text=METRICS.read_text()) as na, \
                PodVllmNode(tmp_path / "b", node, b, tp=2, port=port, metrics_text=METRICS.read_text()) as nb:
            merge_scenarios([na, nb], tmp_path / "scenario.txt")
            _kvf(node, tmp_path / "scenario.txt", "inspect", "--save", str(tmp_path / "node.json"))
            ours = {na.engine_pid: "team-a", nb.engine_pid: "team-b"}
    snap = json.loads((tmp_path / "node.json").read_text())
    # another copy of the suite may run its own fake engines on this machine: only ours are looked at
    index = {ours[e["server"]["pid"]]: i for i, e in enumerate(snap["engines"]["engines"])
             if e.get("server") and e["server"]["pid"] in ours}
    assert {(e["server"]["container"]["namespace"], e["server"]["container"]["pod"])
            for e in (snap["engines"]["engines"][i] for i in index.values())} == {("team-a", "llama-0"),
                                                                                 ("team-b", "llama-0")}
    code, out, err = run_cli(["inspect", "--from", str(tmp_path / "node.json"), "--json"])  # the bundle carries them
    assert json.loads(out)["targets"][0]["pod"]["namespace"] in ("team-a", "team-b")
    first, second = (_registry_samples(snap, index[team]) for team in ("team-a", "team-b"))
    engine_series = [{k for k in s if k[0].startswith("kvforensics_engine_") or "engine" in dict(k[1])}
                     for s in (first, second)]
    assert engine_series[0] and engine_series[1] and not engine_series[0] & engine_series[1]
    node_series = [{k for k in s if k[0].startswith("kvforensics_gpu_memory_total")} for s in (first, second)]
    assert node_series[0] == node_series[1] and len(node_series[0]) == 4
    # one writer for the node: both pods' engines in one registry, each series once
    both = prometheus.NodeSeries(engines=tuple(prometheus.EngineSeries(inspection=_inspection(snap, index[team]))
                                               for team in ("team-a", "team-b")))
    text = prometheus.render(prometheus.registry(both))
    lines = [x for x in text.splitlines() if x and not x.startswith("#")]
    assert len(lines) == len({x.rsplit(" ", 1)[0] for x in lines}) == len(_samples(text))
    assert set(_samples(text)) >= engine_series[0] | engine_series[1] | node_series[0]



def test_engine_names_one_of_two_pods_serving_on_the_same_port(tmp_path):
    """--engine NAMESPACE/POD:PORT explains that pod's server; a port both pods serve on names two servers and
    inspect says so (never a guess); record --engine PORT records both. (The port is this test's own: another
    copy of the suite runs its pods on its own.)"""
    with Node(tmp_path) as node, decoy() as port:
        a = node.add(Pod("team-a", "llama-0", "vllm", driver="systemd"))
        b = node.add(Pod("team-b", "llama-0", "vllm", driver="cgroupfs"))
        with PodVllmNode(tmp_path / "a", node, a, tp=2, port=port, metrics_text=METRICS.read_text()) as na, \
                PodVllmNode(tmp_path / "b", node, b, tp=2, port=port, metrics_text=METRICS.read_text()) as nb:
            scenario = tmp_path / "scenario.txt"
            merge_scenarios([na, nb], scenario)
            one = _kvf(node, scenario, "inspect", "--json", "--engine", "team-b/llama-0:{}".format(port), "--save",
                       str(tmp_path / "one.json"))
            two = _kvf(node, scenario, "inspect", "--json", "--engine", str(port))
            _kvf(node, scenario, "record", "--db", str(tmp_path / "h.db"), "--prom-file", str(tmp_path / "k.prom"),
                 "--engine", str(port), "--quiet")
            b_pid = nb.engine_pid
    chosen = json.loads(one.stdout)["targets"][0]
    assert chosen["pod"]["namespace"] == "team-b" and chosen["status"] == "ok"
    engines = json.loads((tmp_path / "one.json").read_text())["engines"]
    assert engines["engines"][engines["selected"]]["server"]["pid"] == b_pid
    other = next(f["detail"] for f in chosen["findings"] if f["code"] == "other_engines")
    assert "vLLM on port {} in pod team-a/llama-0 (".format(port) in other
    assert "Inspect another with --engine NAMESPACE/POD[:PORT], e.g. --engine " in other  # (the first other's)
    target = json.loads(two.stdout)["targets"][0]
    finding = next(f for f in target["findings"] if f["code"] == "engine_not_found")
    names = ["team-a/llama-0:{}".format(port), "team-b/llama-0:{}".format(port)]
    assert finding["title"] == "--engine names several servers"
    assert all(n in finding["detail"] for n in names)
    assert {"code": "engines.ambiguous", "message": "--engine {} names 2 servers ({}): name one by its pod, "
            "NAMESPACE/POD[:PORT]".format(port, ", ".join(names))} in target["problems"]
    pods = {dict(labels).get("namespace") for (name, labels) in _samples((tmp_path / "k.prom").read_text())
            if name == "kvforensics_engine_kv_pool_tokens"}
    assert pods == {"team-a", "team-b"}
