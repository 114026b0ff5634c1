"""One node, one writer: a `record` covers every engine on the node (each explained, each with its own run),
writes the node's own series once and each engine's series once, says which engine is gone
(`kvforensics_engine_up 0`), keeps `last_success` across runs that collect nothing, and labels what
joins (PCI bus id, GPU model, the engine's version, model and budget)."""

from __future__ import annotations

import copy
import json
import shutil
import sqlite3
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Dict, Tuple

import pytest

from tests.conftest import ROOT, run_cli
from tests.fakenode import FAKE_LIB, GIB
from tests.fleetnode import TwoEngines

Series = Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float]


def _series(text: str) -> Series:
    """Series as Prometheus keys them (a label with an empty value is no label); a series twice fails."""
    from prometheus_client.parser import text_string_to_metric_families

    out: Series = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if v)))
            assert key not in out, "twice: {}".format(key)
            out[key] = s.value
    return out


def _of(series: Series, name: str, **labels: str) -> Dict[Tuple[Tuple[str, str], ...], float]:
    return {k[1]: v for k, v in series.items() if k[0] == name and all(dict(k[1]).get(x) == y
                                                                          for x, y in labels.items())}


def _record(db: Path, prom: Path, *extra: str) -> Tuple[int, str, str]:
    return run_cli(["record", "--db", str(db), "--nvml-lib", str(FAKE_LIB), "--prom-file", str(prom)] + list(extra))


@pytest.fixture
def two(tmp_path, monkeypatch):
    with TwoEngines(tmp_path / "node") as node:
        monkeypatch.setenv("FAKE_NVML_SCENARIO", str(node.scenario))
        yield node


def test_one_record_covers_both_engines_and_writes_every_series_once(two, tmp_path):
    db, prom = tmp_path / "h.db", tmp_path / "kvforensics.prom"
    code, out, err = _record(db, prom, "--samples", "2", "--interval", "0")
    assert code == 0, err
    assert "{} run sglang:".format(two.sglang_label) in out and "{} run vllm:".format(two.vllm_label) in out
    series = _series(prom.read_text())
    # the node's own series once, without an engine label: four GPUs, the host, the node's collectors
    assert len(_of(series, "kvforensics_gpu_memory_free_bytes")) == 4
    assert all("engine" not in dict(k) for k in _of(series, "kvforensics_gpu_up"))
    assert set(dict(k)["collector"] for k in _of(series, "kvforensics_collector_success")) >= {
        "nvml", "host_memory", "engines", "gpu_processes", "engine_log"}
    assert len(_of(series, "kvforensics_last_success_timestamp_seconds")) == 1
    # each engine's series with its label, on its own GPUs
    lows = _of(series, "kvforensics_gpu_memory_free_low_water_bytes")
    assert sorted((dict(k)["engine"], dict(k)["gpu"], dict(k)["rank"]) for k in lows) == [
        (two.sglang_label, "0", "TP0"), (two.sglang_label, "1", "TP1"),
        (two.vllm_label, "2", "Worker_TP0"), (two.vllm_label, "3", "Worker_TP1")]
    for engine in two.engines:
        assert list(_of(series, "kvforensics_engine_up", engine=engine).values()) == [1]
        assert len(_of(series, "kvforensics_engine_kv_pool_tokens", engine=engine)) == 1
        assert len(_of(series, "kvforensics_margin_bytes", engine=engine)) == 1
        assert _of(series, "kvforensics_collector_success", engine=engine, collector="engine_log")
    # what the engines' own /metrics say now, and what each runs
    assert list(_of(series, "kvforensics_engine_kv_usage_ratio", engine=two.sglang_label).values()) == [0.25]
    assert list(_of(series, "kvforensics_engine_requests_queued", engine=two.sglang_label).values()) == [1]
    # vLLM's two data-parallel engines (12 and 9 running) are one server
    assert list(_of(series, "kvforensics_engine_requests_running", engine=two.vllm_label).values()) == [21]
    (info,) = _of(series, "kvforensics_engine_info", engine=two.vllm_label)
    info = dict(info)
    assert info["kind"] == "vllm" and info["model"] == "meta-llama/Llama-3.1-70B-Instruct"
    assert info["budget_flag"] == "--gpu-memory-utilization" and info["budget_value"] == "0.9" and info["version"]
    (info,) = _of(series, "kvforensics_engine_info", engine=two.sglang_label)
    assert dict(info)["budget_flag"] == "--mem-fraction-static" and dict(info)["recommended_value"]
    # the GPU series join dcgm-exporter's on pci_bus_id, and carry the GPU's model
    (gpu2,) = _of(series, "kvforensics_gpu_up", gpu="2")
    assert dict(gpu2)["pci_bus_id"] == "00000000:08:00.0" and dict(gpu2)["gpu_model"] == "NVIDIA H200"
    # two runs in the one history, each with its own GPUs
    runs = json.loads(run_cli(["history", "--db", str(db), "--json"])[1])["runs"]
    assert sorted((r["engine"], r["samples"]) for r in runs) == sorted((e, 2) for e in two.engines)
    assert sorted(g["gpu"] for r in runs for g in r["gpus"]) == [0, 1, 2, 3]  # each GPU in one run


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (CI installs prometheus)")
def test_promtool_finds_nothing_to_say_about_two_engines(two, tmp_path):
    prom = tmp_path / "kvforensics.prom"
    assert _record(tmp_path / "h.db", prom)[0] == 0
    done = subprocess.run(["promtool", "check", "metrics"], input=prom.read_text(), capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout + done.stderr == "", done.stdout + done.stderr


def test_engines_recorded_apart_write_no_series_twice(two, tmp_path):
    """--engine PORT restricts a record to one engine and leaves the node's series to one writer
    (--node-series): the files, concatenated as the textfile collector merges them, hold no series twice;
    and Debian's node_exporter, reading both, reports no textfile error."""
    db = tmp_path / "h.db"
    (tmp_path / "tf").mkdir()
    files = [tmp_path / "tf" / "kvforensics-sglang.prom", tmp_path / "tf" / "kvforensics-vllm.prom"]
    sglang_port, vllm_port = (e.rsplit("-", 1)[1] for e in two.engines)
    assert _record(db, files[0], "--engine", sglang_port, "--node-series")[0] == 0
    assert _record(db, files[1], "--engine", vllm_port)[0] == 0
    first, second = (_series(f.read_text()) for f in files)
    both = _series(files[0].read_text() + files[1].read_text())  # asserts no series twice
    assert len(both) == len(first) + len(second)
    assert _of(first, "kvforensics_gpu_memory_free_bytes") and not _of(second, "kvforensics_gpu_memory_free_bytes")
    assert {dict(k).get("engine") for k in _of(second, "kvforensics_engine_up")} == {two.vllm_label}
    assert not _of(second, "kvforensics_last_success_timestamp_seconds")
    from tests import promstack

    if promstack.missing() is None:
        with promstack.Stack(tmp_path / "stack") as stack:
            scraped = promstack.get(stack.node_exporter(tmp_path / "tf").url + "/metrics")
        assert "node_textfile_scrape_error 0" in scraped
        assert scraped.count("kvforensics_engine_up{") == 2


def test_a_gone_engine_is_down_for_an_hour_and_its_series_stop(two, tmp_path):
    db, prom = tmp_path / "h.db", tmp_path / "kvforensics.prom"
    two.set_free(vllm_gib=1.0)  # the vLLM engine dips below the margin, then dies
    assert _record(db, prom)[0] == 0
    two.stop_vllm()
    code, out, err = _record(db, prom)
    assert code == 0 and "gone: {}".format(two.vllm_label) in out, err
    series = _series(prom.read_text())
    assert list(_of(series, "kvforensics_engine_up", engine=two.vllm_label).values()) == [0]
    assert list(_of(series, "kvforensics_engine_up", engine=two.sglang_label).values()) == [1]
    for name in ("kvforensics_gpu_memory_free_low_water_bytes", "kvforensics_gpu_memory_free_min_bytes",
                 "kvforensics_margin_bytes", "kvforensics_engine_unused_bytes", "kvforensics_findings"):
        assert not _of(series, name, engine=two.vllm_label), name  # nothing left to alert on but engine_up
    assert len(_of(series, "kvforensics_gpu_memory_free_bytes")) == 4  # its GPUs are still the node's
    # an hour later it no longer counts
    conn = sqlite3.connect(str(db))
    with conn:
        conn.execute("UPDATE runs SET first_seen = first_seen - 7200, last_seen = last_seen - 7200 "
                     "WHERE engine = ?", (two.vllm_label,))
    conn.close()
    assert _record(db, prom)[0] == 0
    assert not _of(_series(prom.read_text()), "kvforensics_engine_up", engine=two.vllm_label)


def test_gone_after_holds_a_gone_engine_down_longer(two, tmp_path):
    """--gone-after 1d: the engine that died two hours ago is still down (the alert holds until someone looks);
    three days later it leaves. Longer than --keep, or not a duration: one line, exit 2, nothing recorded."""
    db, prom = tmp_path / "h.db", tmp_path / "kvforensics.prom"
    assert _record(db, prom)[0] == 0
    two.stop_vllm()

    def age(seconds: int) -> None:
        conn = sqlite3.connect(str(db))
        with conn:
            conn.execute("UPDATE runs SET first_seen = first_seen - ?, last_seen = last_seen - ? WHERE engine = ?",
                         (seconds, seconds, two.vllm_label))
        conn.close()

    age(7200)
    code, out, err = _record(db, prom, "--gone-after", "1d")
    assert code == 0 and "gone: {}".format(two.vllm_label) in out, err
    assert list(_of(_series(prom.read_text()), "kvforensics_engine_up", engine=two.vllm_label).values()) == [0]
    age(3 * 86400)
    assert _record(db, prom, "--gone-after", "1d")[0] == 0
    assert not _of(_series(prom.read_text()), "kvforensics_engine_up", engine=two.vllm_label)
    for bad, words in ((["--gone-after", "40d"], "--gone-after 40d is longer than --keep"),
                       (["--gone-after", "soon"], "--gone-after: durations look like")):
        code, _, err = _record(tmp_path / "other.db", prom, *bad)
        assert code == 2 and words in err and err.count("\n") == 1
        assert not (tmp_path / "other.db").exists()


def test_a_restarted_engine_is_up_in_a_new_run(tmp_path, monkeypatch):
    """The same engine on the same port restarted: a new run, up, with fresh low-water marks; nothing gone."""
    from tests.fakenode import FakeNode, build_fake_nvml

    build_fake_nvml()
    db, prom = tmp_path / "h.db", tmp_path / "kvforensics.prom"
    for i, free in enumerate((1.0, 6.0)):
        with FakeNode(tmp_path / "node{}".format(i), free_bytes=[int(free * GIB)] * 8) as node:
            monkeypatch.setenv("FAKE_NVML_SCENARIO", str(node.scenario))
            code, out, err = _record(db, prom, "--no-http")
            assert code == 0 and "gone" not in out, err
    series = _series(prom.read_text())
    assert _of(series, "kvforensics_engine_up") == {(("engine", "sglang-1"),): 1}
    lows = _of(series, "kvforensics_gpu_memory_free_low_water_bytes", engine="sglang-1")
    assert set(lows.values()) == {6 * GIB}  # the new run's own marks, not the old run's 1 GiB
    assert len(json.loads(run_cli(["history", "--db", str(db), "--json"])[1])["runs"]) == 2


def test_last_success_is_kept_when_a_run_collects_nothing(tmp_path, monkeypatch):
    """A run that collects nothing (no NVIDIA library, no engine, no host memory) exits 3 and exports the
    last success from the history, unchanged: KvforensicsRecordNotRunning fires 30 minutes later."""
    from kvforensics.collectors import snapshot

    seed = json.loads((ROOT / "examples" / "seed-node.json").read_text())
    seed.pop("engine_log", None)
    nothing = copy.deepcopy(seed)
    nothing["nvml"] = {"status": "absent", "gpus": [], "problems": [{"code": "nvml.library_not_found",
                                                                     "message": "no libnvidia-ml.so.1"}]}
    nothing["host_memory"] = {"status": "failed", "problems": []}
    nothing["engines"] = {"status": "absent", "engines": [], "problems": []}
    nothing["gpu_processes"] = {"status": "ok", "processes": {}}
    nothing["collector_runs"] = [{"name": "nvml", "status": "absent", "duration_s": 0.001},
                                 {"name": "host_memory", "status": "failed", "duration_s": 0.001}]
    db, prom = tmp_path / "h.db", tmp_path / "k.prom"
    monkeypatch.setattr(snapshot, "collect_each", lambda **kw: [copy.deepcopy(seed)])
    assert _record(db, prom)[0] == 0
    before = list(_of(_series(prom.read_text()), "kvforensics_last_success_timestamp_seconds").values())
    monkeypatch.setattr(snapshot, "collect_each", lambda **kw: [copy.deepcopy(nothing)])
    time.sleep(0.01)
    code, out, err = _record(db, prom)
    assert code == 3 and "collected nothing" in err
    series = _series(prom.read_text())
    assert list(_of(series, "kvforensics_last_success_timestamp_seconds").values()) == before
    assert list(_of(series, "kvforensics_collector_success", collector="nvml").values()) == [0]


def _engine_record(engine: str, pod: Tuple[Tuple[str, str], ...], first_seen: float):
    from kvforensics.agent.model.evidence import Pod

    values = dict(pod)
    selected = SimpleNamespace(pod=Pod(namespace=values["namespace"], name=values["pod"], uid="u",
                                       container=values.get("container")) if pod else None)
    insp = SimpleNamespace(engine=engine, snapshot=SimpleNamespace(selected=selected))
    return SimpleNamespace(inspection=insp, stats=SimpleNamespace(run_key="now", first_seen=first_seen))


@pytest.mark.parametrize("now_pod,started,gone", [
    ((("namespace", "ml"), ("pod", "llama-7f9c"), ("container", "vllm")), 2000.0, False),  # a rolling update
    ((("namespace", "ml"), ("pod", "llama-7f9c"), ("container", "vllm")), 500.0, True),  # both ran at once
    ((("namespace", "other"), ("pod", "llama-7f9c"), ("container", "vllm")), 2000.0, True),  # another team's
    ((), 2000.0, True),  # not in a pod
])
def test_a_replaced_pod_is_not_a_gone_engine(tmp_path, now_pod, started, gone):
    from kvforensics.agent.history import record as record_mod
    from kvforensics.agent.history import store as history

    opened = history.open_db(str(tmp_path / "h.db"))
    try:
        rid = history.upsert_run(opened.conn, "old", 1000.0, engine="vllm-8000", port=8000, namespace="ml",
                                 pod="llama-5d2a", container="vllm")
        history.add_sample(opened.conn, rid, 1000.0, True, [], None)
        found = record_mod._gone(opened.conn, [_engine_record("vllm-8000", now_pod, started)], None, 1500.0)
    finally:
        opened.conn.close()
    assert [r.pod for r in found] == ([(("namespace", "ml"), ("pod", "llama-5d2a"), ("container", "vllm"))]
                                      if gone else [])


def test_kvforensics_serve_covers_both_engines_too(two, tmp_path):
    """serve exports what record exports: both engines, the node's series once."""

    from tests.test_serve import start_serve

    served = start_serve(dict(two.sglang.env(), FAKE_NVML_SCENARIO=str(two.scenario)), "--db", str(tmp_path / "h.db"),
                         "--nvml-lib", str(FAKE_LIB))
    try:
        status, text = served.get("/metrics")
    finally:
        served.stop()
    assert status == 200, text
    series = _series(text)
    assert {dict(k)["engine"] for k in _of(series, "kvforensics_engine_up")} == set(two.engines)
    assert len(_of(series, "kvforensics_gpu_memory_free_bytes")) == 4


def test_a_v0_worker_the_log_does_not_name_keeps_its_label_across_a_restart(tmp_path, monkeypatch):
    """vLLM V0: the forked rank the log does not name is labelled by its GPU, never by its PID, so its
    series are the same series after a restart (a new PID)."""
    from tests.fakenode import FakeVllmNode, build_fake_nvml

    build_fake_nvml()
    prom = tmp_path / "k.prom"
    ranks = []
    for i in range(2):
        with FakeVllmNode(tmp_path / "v0-{}".format(i), tp=2, era="v0", utilization=0.8) as node:
            monkeypatch.setenv("FAKE_NVML_SCENARIO", str(node.scenario))
            assert _record(tmp_path / "h{}.db".format(i), prom, "--no-http")[0] == 0
            pids = set(map(str, node.pids.values()))
        labels = _of(_series(prom.read_text()), "kvforensics_gpu_memory_free_low_water_bytes")
        ranks.append(sorted(dict(k)["rank"] for k in labels))
        assert not any(p in r for r in ranks[-1] for p in pids)
    assert ranks[0] == ranks[1] == ["driver", "worker GPU1"]
