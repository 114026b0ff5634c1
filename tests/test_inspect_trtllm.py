"""kvforensics inspect on a fake trtllm-serve node: the fake NVML driver, real processes whose command lines are
trtllm-serve's and mpi4py's workers, the startup log on the server's stdout and a real /prometheus/metrics page.

The log is built in 1.1.0rc3's line shapes (tests/fakenode.py trtllm_pytorch_log) with its figures from the
release's rules, so what the report says can be computed here: on each GPU the process's peak is the profiled
peak − the temporary pool + the KV cache, and what is left beside it is the headroom."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli
from tests.fakenode import FAKE_LIB, GIB, H200_RESERVED, H200_TOTAL, FakeTrtllmNode, build_fake_nvml, trtllm_pytorch_log

MARGIN = 2 * GIB
PEAK, TMP, WEIGHTS, CELL = 43.67, 0.28, 37.72, 65536
METRICS = """\
# HELP trtllm_num_requests_running Number of requests currently running.
# TYPE trtllm_num_requests_running gauge
trtllm_num_requests_running{model_name="llama"} 12.0
# TYPE trtllm_num_requests_waiting gauge
trtllm_num_requests_waiting{model_name="llama"} 0.0
# TYPE trtllm_kv_cache_utilization gauge
trtllm_kv_cache_utilization{model_name="llama"} 0.41
"""


@pytest.fixture(scope="session")
def fake_lib():
    return build_fake_nvml()


def _cuda_total_gib() -> float:
    return round((H200_TOTAL - H200_RESERVED) / GIB, 2)


def test_trtllm_serve_tp2_ranks_placed_and_the_fraction_raise_sized_from_the_peak(tmp_path, fake_lib, monkeypatch):
    log, fig = trtllm_pytorch_log(2, _cuda_total_gib(), PEAK, TMP, WEIGHTS, CELL)
    with FakeTrtllmNode(tmp_path, log, tp=2, free_bytes=[12 * GIB, 12 * GIB], metrics_text=METRICS) as n:
        monkeypatch.setenv("FAKE_NVML_SCENARIO", str(n.scenario))
        code, out, err = run_cli(["inspect", "--json", "--nvml-lib", str(FAKE_LIB)])
        pids = dict(n.pids)
        port = n.port
    assert code in (0, 1), err
    t = json.loads(out)["targets"][0]
    assert t["engine"]["name"] == "trtllm" and t["engine"]["era"] == "pytorch"
    assert t["engine"]["server_args"]["tp_size"] == 2
    assert t["engine"]["server_args"]["kv_cache_free_gpu_memory_fraction"] == 0.9
    assert [g["rank"] for g in t["gpus"]] == ["RANK 0", "RANK 1"]
    for g, pid in zip(t["gpus"], pids["workers"]):
        assert [(p["pid"], p["owner"]) for p in g["processes"]] == [(pid, "engine")]
        ledger = {x["item"]: x["bytes"] for x in g["ledger"]}
        assert ledger["KV pool"] == round(fig["kv"] * GIB) and ledger["weights"] == round(WEIGHTS * GIB)
        assert sum(x["bytes"] for x in g["ledger"]) == g["total_bytes"]
    # NVML shows 12 GiB free, but the peak returns: total − reserved − (peak − tmp + KV) is what is left.
    cuda_total = H200_TOTAL - H200_RESERVED
    room = cuda_total - (round(PEAK * GIB) - round(TMP * GIB) + round(fig["kv"] * GIB))
    f = {x["code"]: x for x in t["findings"]}
    assert f["unused_gpu_memory"]["bytes"] == room - MARGIN
    assert "profiled peak" in f["unused_gpu_memory"]["detail"]
    rec = t["recommendations"][0]
    assert rec["flag"] == "--kv_cache_free_gpu_memory_fraction"
    base = round(_cuda_total_gib() * GIB) - round(PEAK * GIB) + round(TMP * GIB)
    assert rec["value"] == "{:.2f}".format(int((round(fig["kv"] * GIB) + room - MARGIN) * 100 // base) / 100)
    assert t["verdict"]["cause_finding"] == "kv_fraction_semantics"
    assert "Live (http://127.0.0.1:{}/prometheus/metrics): running 12, waiting 0, KV cache usage 41%".format(port) \
        in f["concurrency_bound"]["detail"]


def test_requests_waiting_beside_a_half_empty_cache_name_the_scheduler_policy(tmp_path, fake_lib, monkeypatch):
    log, _ = trtllm_pytorch_log(1, _cuda_total_gib(), PEAK, TMP, WEIGHTS, CELL)
    waiting = METRICS.replace('waiting{model_name="llama"} 0.0', 'waiting{model_name="llama"} 7.0')
    with FakeTrtllmNode(tmp_path, log, tp=1, free_bytes=[12 * GIB], metrics_text=waiting) as n:
        monkeypatch.setenv("FAKE_NVML_SCENARIO", str(n.scenario))
        code, out, err = run_cli(["inspect", "--json", "--nvml-lib", str(FAKE_LIB)])
    assert code in (0, 1), err
    f = {x["code"]: x for x in json.loads(out)["targets"][0]["findings"]}
    assert f["scheduler_reserves_kv"]["severity"] == "warning"
    assert f["scheduler_reserves_kv"]["title"].startswith("7 request(s) wait while the KV cache is 41% used")
    code, out, err = run_cli(["inspect", "--json", "--nvml-lib", str(FAKE_LIB)])  # the node is gone: no engine
    assert "scheduler_reserves_kv" not in out


def test_record_keeps_the_run_and_writes_its_series(tmp_path, fake_lib, monkeypatch):
    """Cron mode covers TensorRT-LLM as the other two: a run named trtllm-PORT with its KV tokens, a low-water mark
    per rank, and the per-rank KV pool in the textfile."""
    log, fig = trtllm_pytorch_log(2, _cuda_total_gib(), PEAK, TMP, WEIGHTS, CELL)
    db, prom = tmp_path / "h.db", tmp_path / "kvf.prom"
    with FakeTrtllmNode(tmp_path / "node", log, tp=2, free_bytes=[12 * GIB, 11 * GIB]) as n:
        monkeypatch.setenv("FAKE_NVML_SCENARIO", str(n.scenario))
        code, out, err = run_cli(["record", "--db", str(db), "--nvml-lib", str(FAKE_LIB), "--no-http", "--prom-file",
                                  str(prom)])
        port = n.port
    assert code == 0, err
    code, out, err = run_cli(["history", "--db", str(db), "--json"])
    (run,) = json.loads(out)["runs"]
    assert run["engine"] == "trtllm-{}".format(port) and run["kv_tokens"] == fig["tokens"]
    assert {g["rank"]: g["min_free_bytes"] for g in run["gpus"]} == {"RANK 0": 12 * GIB, "RANK 1": 11 * GIB}
    pools = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in prom.read_text().splitlines()
             if line.startswith("kvforensics_engine_kv_pool_bytes{")}
    assert pools == {'kvforensics_engine_kv_pool_bytes{{engine="trtllm-{}",rank="RANK {}"}}'.format(port, r):
                     round(fig["kv"] * GIB) for r in (0, 1)}
