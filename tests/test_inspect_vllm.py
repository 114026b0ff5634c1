"""kvforensics inspect and record on a fake vLLM node: fake NVML driver + real processes whose command
lines and titles are vLLM's + a real log with their live PIDs + a real /metrics endpoint.

Expected figures are computed here from vLLM's rules: the budget is T·u of the CUDA total (which a
real H200 showed to be NVML total − reserved, bench/RESULTS.md), the process adds its CUDA context
(527 MiB measured there), and from 0.20 the CUDA graph pool is inside the budget."""

from __future__ import annotations

import json
import math
import re

import pytest

from kvforensics.collectors import engines
from kvforensics.collectors.vllm import processes as vllm_processes
from tests.conftest import ROOT, run_cli
from tests.fakenode import FAKE_LIB, GIB, MIB, TOTAL, FakeNode, FakeVllmNode, build_fake_nvml

CONTEXT = 527 * MIB
MARGIN = 2 * GIB  # the default --margin
METRICS = (ROOT / "tests" / "fixtures" / "vllm_metrics" / "v0.11.0_v1_dp2.prom")


@pytest.fixture(scope="session")
def fake_lib():
    return build_fake_nvml()


def _inspect(*extra):
    code, out, err = run_cli(["inspect", "--json", "--nvml-lib", str(FAKE_LIB), *extra])
    assert code in (0, 1), err
    return json.loads(out)["targets"][0]


def _codes(t):
    return {f["code"]: f for f in t["findings"]}


@pytest.mark.parametrize("argv,role,extra", [
    (["/usr/bin/python3", "/usr/local/bin/vllm", "serve", "org/m", "-tp", "2"], "server", {"launch": "serve"}),
    (["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"], "server", {"launch": "api_server"}),
    (["python", "-m", "vllm.entrypoints.api_server"], "server", {"launch": "api_server"}),
    (["VLLM::EngineCore"], "worker", {"rank": "EngineCore"}),
    (["VLLM::EngineCore_DP1"], "worker", {"rank": "EngineCore_DP1"}),
    (["VLLM::Worker_PP1_TP3"], "worker", {"rank": "Worker_PP1_TP3"}),
    (["VLLM::EngineCore_TP1"], "worker", {"rank": "EngineCore_TP1"}),  # 0.10.1: a worker appends to its title
    (["VLLM::APIServer_0"], "helper", {}),
    (["VLLM::DPCoordinator"], "helper", {}),
    (["ray::RayWorkerWrapper.execute_method"], "child", {}),
    (["/usr/bin/python3", "-c", "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5)",
      "--multiprocessing-fork"], "child", {"rank": ""}),
    (["vim", "vllm serve notes.md"], None, {}),
    (["python3", "train.py", "--vllm"], None, {}),
])
def test_vllm_command_lines(argv, role, extra):
    got = vllm_processes.classify(argv)
    assert (got or {}).get("role") == role
    for key, value in extra.items():
        assert got[key] == value
    if role is not None:
        assert engines.classify(argv)[0] == "vllm"


@pytest.mark.parametrize("argv,want", [
    (["--device-memory-utilization", "0.8"], {"gpu_memory_utilization": 0.8}),  # the 0.31+ alias
    (["--gpu-memory", "0.85"], {"gpu_memory_utilization": 0.85}),  # argparse abbreviation
    (["--kv-cache-memory=4805904446"], {"kv_cache_memory_bytes": 4805904446}),  # as vLLM's own advice spells it
    (["--max", "5"], {"max": 5}),  # ambiguous: kept as given
])
def test_vllm_flag_aliases_and_abbreviations(argv, want):
    assert vllm_processes.parse_flags(argv) == want


def test_vllm_flags_like_its_argparse():
    assert vllm_processes.parse_flags(["meta-llama/L", "-tp", "4", "--gpu_memory_utilization=0.85", "--port", "8001",
                                       "--enforce-eager", "--no-enable-prefix-caching", "--max-model-len", "32768"]) \
        == {"model": "meta-llama/L", "tensor_parallel_size": 4, "gpu_memory_utilization": 0.85, "port": 8001,
            "enforce_eager": True, "enable_prefix_caching": False, "max_model_len": 32768}


def _room(node: FakeVllmNode, u: float, others: int = 0, graphs_outside: int = 0) -> int:
    """Free memory at vLLM's peak: NVML total − reserved − (T·u + what no budget covers + graphs outside),
    with T = NVML total − reserved (cudaMemGetInfo's total). What no budget covers: the context and the
    other processes now, or more where the log's 'Free memory on device (free/total GiB) on startup' (the
    0.27 template: 139.28/139.8) says more was in use at startup (vLLM 0.27 gpu_worker.py)."""
    cuda_total = node.total - node.reserved
    m = re.search(r"Free memory on device \(([\d.]+)/([\d.]+) GiB\) on startup", node.template.read_text())
    at_start = round(float(m.group(2)) * GIB) - round(float(m.group(1)) * GIB) if m else 0
    return cuda_total - int(cuda_total * u) - max(at_start, CONTEXT + others) - graphs_outside


def test_v1_tp2_workers_placed_by_their_log_pids(tmp_path, fake_lib, monkeypatch):
    with FakeVllmNode(tmp_path, tp=2, foreign={1: 2 * GIB}, metrics_text=METRICS.read_text()) as n:
        monkeypatch.setenv("FAKE_NVML_SCENARIO", str(n.scenario))
        port = n.port
        t = _inspect()
        code, text, err = run_cli(["inspect", "--nvml-lib", str(FAKE_LIB)])
        pids = dict(n.pids)
    assert t["status"] == "ok", t["problems"]
    assert t["engine"]["name"] == "vllm" and t["engine"]["era"] == "V1-f"
    assert [g["rank"] for g in t["gpus"]] == ["Worker_TP0", "Worker_TP1"]  # stable labels: no PID
    assert [r["rank"] for r in t["startup"]["ranks"]] == ["Worker_TP0 pid={}".format(pids["tp0"]),
                                                          "Worker_TP1 pid={}".format(pids["tp1"])]
    g0 = t["gpus"][0]
    assert [(p["pid"], p["owner"]) for p in g0["processes"]] == [(pids["tp0"], "engine")]
    ledger = {x["item"]: x["bytes"] for x in g0["ledger"]}
    w = t["startup"]["ranks"][0]
    assert ledger["weights"] == w["weights_bytes"] == round(65.72 * GIB)
    assert ledger["KV pool"] == w["available_kv_bytes"] == round(54.2 * GIB)
    assert ledger["CUDA graphs"] == w["cuda_graph_bytes"] == round(0.58 * GIB)
    assert sum(x["bytes"] for x in g0["ledger"]) == g0["total_bytes"]
    # By design on GPU 1 (the foreign process's): 0.27's budget is T·u with graphs inside it.
    room = _room(n, 0.9, others=2 * GIB)
    f = _codes(t)
    assert f["unused_gpu_memory"]["bytes"] == room - MARGIN
    assert "activation peak the budget reserves" in f["unused_gpu_memory"]["detail"]
    rec = t["recommendations"][0]
    total = w["total_gpu_bytes"]
    assert rec["flag"] == "--gpu-memory-utilization"
    assert rec["value"] == "{:.2f}".format(math.floor((0.9 + (room - MARGIN) / total) * 100) / 100) == "0.96"
    assert "vLLM's budget is a share of the GPU's total" in f["foreign_gpu_process"]["detail"]
    assert "rank_imbalance" not in f  # the 2 GiB process does not shrink vLLM's budget: nothing unused by it
    assert "host_ram_offload" not in f  # HiCache is SGLang's
    live = f["concurrency_bound"]["detail"]
    assert "Live (http://127.0.0.1:{}/metrics): running 21, waiting 4, KV cache usage 62%, preemptions since " \
        "start 3".format(port) in live  # summed over the two engines; the fuller engine's usage
    assert f["concurrency_bound"]["severity"] == "warning"  # requests are waiting
    assert "At 8,192 tokens per request (--request-tokens): about {:,} at once".format(355200 // 8192) in live
    assert code in (0, 1) and "vLLM V1 0.27.0" in text and "Worker_TP1" in text


def test_v1_tp1_engine_core_holds_the_gpu_and_matches_the_logs_name(tmp_path, fake_lib, monkeypatch):
    """TP=1: the engine core is the worker; its title says EngineCore where the log says EngineCore_DP0,
    and this log is from an earlier run (other PIDs): the title still finds its figures."""
    log = tmp_path / "t.log"
    core = "(EngineCore_DP0 pid=4242) INFO 11-30 09:01:{:02d} "
    log.write_text("\n".join(core.format(i) + line for i, line in enumerate((
        "[gpu_model_runner.py:3410] Model loading took 14.9900 GiB and 9.1 seconds",
        "[gpu_worker.py:410] Available KV cache memory: 105.3 GiB",
        "[kv_cache_utils.py:1291] GPU KV cache size: 862,592 tokens",
        "[core.py:250] init engine (profile, create kv cache, warmup model) took 43.20 seconds"))) + "\n")
    with FakeVllmNode(tmp_path / "n", tp=1, log_template=log) as n:
        monkeypatch.setenv("FAKE_NVML_SCENARIO", str(n.scenario))
        t = _inspect()
        core = n.pids["core"]
    g = t["gpus"][0]
    assert g["rank"] == "EngineCore_DP0" and g["processes"][0]["pid"] == core
    assert {x["item"]: x["bytes"] for x in g["ledger"]}["KV pool"] == round(105.3 * GIB)
    # No T or u in this log: u comes from the command line (--gpu-memory-utilization 0.9), T from NVML.
    spare = _room(n, 0.9) - MARGIN
    assert _codes(t)["unused_gpu_memory"]["bytes"] == spare
    rec = t["recommendations"][0]
    cuda_total = n.total - n.reserved
    assert rec["value"] == "{:.2f}".format(math.floor((0.9 + spare / cuda_total) * 100) / 100) == "0.98"
    assert "u 0.9 from the running server" in rec["rationale"]


def test_below_the_margin_the_budget_is_lowered_only_on_a_measured_low_water_mark(tmp_path, fake_lib,
                                                                                  monkeypatch):
    """1 GiB free on each GPU (the workers grew past their budget: NCCL, fragments): below the 2 GiB margin.
    One look is a note to watch; over a recorded hour it is evidence, and u goes down by the shortfall,
    rounded down to 0.01."""
    import sqlite3

    db = tmp_path / "h.db"
    with FakeVllmNode(tmp_path, tp=2, free_bytes=[GIB, GIB]) as n:
        monkeypatch.setenv("FAKE_NVML_SCENARIO", str(n.scenario))
        t = _inspect()
        assert _codes(t)["low_headroom"]["severity"] == "info" and not t["recommendations"]
        for _ in range(3):
            code, out, err = run_cli(["record", "--db", str(db), "--nvml-lib", str(FAKE_LIB), "--no-http",
                                      "--quiet"])
            assert code == 0, err
        conn = sqlite3.connect(str(db))
        with conn:
            conn.execute("UPDATE runs SET first_seen = first_seen - 3600")
        conn.close()
        t = _inspect("--db", str(db))
    f = _codes(t)
    assert f["low_headroom"]["bytes"] == GIB and "lower --gpu-memory-utilization" in f["low_headroom"]["detail"]
    assert f["low_headroom"]["severity"] == "warning" and "measured over 60 minutes" in f["low_headroom"]["detail"]
    rec = t["recommendations"][0]
    total = t["startup"]["ranks"][0]["total_gpu_bytes"]
    assert rec["value"] == "{:.2f}".format(math.floor((0.9 - GIB / total) * 100) / 100) == "0.89"
    assert rec["gain_bytes"] < 0 and "below the 2.00 GiB margin" in rec["rationale"]


V0_TOTAL = 81920 * MIB  # an A100 80GB; the real V0 log's worker saw 79.19 GiB
V0_RESERVED = V0_TOTAL - round(79.19 * GIB)


def test_v0_the_server_runs_the_driver_and_forked_ranks_are_workers(tmp_path, fake_lib, monkeypatch):
    """V0: the API server process holds GPU 0 (its lines carry no prefix); a forked rank keeps the
    server's command line and is its worker, not a second server."""
    with FakeVllmNode(tmp_path, tp=2, era="v0", total=V0_TOTAL, reserved=V0_RESERVED,
                      free_bytes=[15 * GIB, 15 * GIB], utilization=0.8) as n:
        monkeypatch.setenv("FAKE_NVML_SCENARIO", str(n.scenario))
        t = _inspect()
        pids = dict(n.pids)
        server = n.server_pid
    assert t["engine"]["name"] == "vllm"
    assert [g["rank"] for g in t["gpus"]] == ["driver", "worker GPU1"]  # by its GPU, never its PID
    assert {p["owner"] for g in t["gpus"] for p in g["processes"]} == {"engine"}
    assert t["gpus"][0]["processes"][0]["pid"] == server and t["gpus"][1]["processes"][0]["pid"] == pids["tp1"]
    ledger = {x["item"]: x["bytes"] for x in t["gpus"][0]["ledger"]}
    assert ledger["KV pool"] == round(61.84 * GIB) and ledger["CUDA graphs"] == round(0.13 * GIB)
    assert "KV pool" not in {x["item"] for x in t["gpus"][1]["ledger"]}  # the log names no second worker
    # V0-c: graphs outside T·u; NVML free (15 GiB) is below the by-design room, so it binds.
    assert _room(n, 0.8, graphs_outside=round(0.13 * GIB)) > 15 * GIB
    assert _codes(t)["unused_gpu_memory"]["bytes"] == 15 * GIB - MARGIN


def test_a_node_running_both_engines_explains_each(tmp_path, fake_lib, monkeypatch):
    sg = FakeNode(tmp_path / "sglang", tp=2, extra_flags=["--port", "30001"])
    vl = FakeVllmNode(tmp_path / "vllm", tp=2)
    with sg, vl:
        port = vl.port
        lines = ["driver 580.159.04"]
        for gpu, (pid, used) in enumerate([(sg.scheduler_pids[0], 80 * GIB), (sg.scheduler_pids[1], 80 * GIB),
                                           (vl.scheduler_pids[0], 70 * GIB), (vl.scheduler_pids[1], 70 * GIB)]):
            lines.append("gpu {} uuid=GPU-{} name=X bus=00000000:{:02X}:00.0 total={} reserved={} used={}".format(
                gpu, gpu, 0x18 + gpu, TOTAL, 546 * MIB, used))
            lines.append("proc {} compute {} {}".format(gpu, pid, used))
        scenario = tmp_path / "both.txt"
        scenario.write_text("\n".join(lines) + "\n")
        monkeypatch.setenv("FAKE_NVML_SCENARIO", str(scenario))
        default = _inspect()
        chosen = _inspect("--engine", str(port))
    assert default["engine"]["name"] == "sglang"  # the one holding the most GPU memory
    assert chosen["engine"]["name"] == "vllm"
    assert [g["rank"] for g in chosen["gpus"]] == [None, None, "Worker_TP0", "Worker_TP1"]
    assert {p["owner"] for g in chosen["gpus"][:2] for p in g["processes"]} == {"other_engine"}
    other = _codes(chosen)["other_engines"]["detail"]
    assert "SGLang on port 30001" in other and "GPU 0,1" in other
    assert "vLLM on port {}".format(port) in _codes(default)["other_engines"]["detail"]
    assert "foreign_gpu_process" not in _codes(default) and "foreign_gpu_process" not in _codes(chosen)


def test_record_labels_the_vllm_engine_by_port(tmp_path, fake_lib, monkeypatch):
    db, prom = tmp_path / "h.db", tmp_path / "kvf.prom"
    with FakeVllmNode(tmp_path / "n", tp=2, metrics_text=METRICS.read_text()) as n:
        monkeypatch.setenv("FAKE_NVML_SCENARIO", str(n.scenario))
        port = n.port
        code, out, err = run_cli(["record", "--db", str(db), "--nvml-lib", str(FAKE_LIB), "--samples", "2",
                                  "--interval", "0", "--prom-file", str(prom)])
    assert code == 0, err
    from prometheus_client.parser import text_string_to_metric_families

    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(prom.read_text()) for s in fam.samples}
    engine = "vllm-{}".format(port)
    assert samples[("kvforensics_engine_kv_pool_bytes", (("engine", engine), ("rank", "Worker_TP0")))] \
        == round(54.2 * GIB)
    assert any(name == "kvforensics_gpu_memory_free_min_bytes" and dict(labels).get("engine") == engine
               and dict(labels).get("rank") == "Worker_TP1" for name, labels in samples)
    run = json.loads(run_cli(["history", "--db", str(db), "--json"])[1])["runs"][0]
    assert run["engine"] == "vllm-{}".format(port) and run["run_key"].startswith("vllm:")
    assert run["peak_token_usage"] is not None and run["model"] == "meta-llama/Llama-3.1-70B-Instruct"
    text = run_cli(["history", "--db", str(db)])[1]
    assert "peak KV cache usage 62%" in text and "no /metrics samples" not in text  # vLLM reports a share


def test_the_vllm_example_bundle(tmp_path):
    """examples/vllm-node.json (examples/make_vllm_bundle.py): two H200s at TP=2, a 2 GiB job beside GPU 1."""
    code, out, err = run_cli(["inspect", "--from", str(ROOT / "examples" / "vllm-node.json"), "--json"])
    assert code == 1, err  # a warning
    t = json.loads(out)["targets"][0]
    assert t["engine"]["name"] == "vllm" and [g["rank"] for g in t["gpus"]] == ["Worker_TP0", "Worker_TP1"]
    node = FakeVllmNode(tmp_path)  # the bundle's GPUs: a real H200's NVML total and reserved
    f = _codes(t)
    assert f["unused_gpu_memory"]["bytes"] == _room(node, 0.9, others=2 * GIB) - MARGIN
    assert t["recommendations"][0]["value"] == "0.96"


QWEN3_14B = ROOT / "tests" / "fixtures" / "model_configs" / "qwen3-14b.json"


def test_model_config_bytes_per_token_against_a_real_log(tmp_path):
    """Real excerpt 15 (vLLM 0.10.2, Qwen3-14B, TP=1): 40 layers × 8 KV heads × (128 + 128) × 2 B = 163,840 B
    per token; the log's 6.51 GiB ÷ 42,656 tokens is within print rounding of it."""
    log = ROOT / "tests" / "fixtures" / "real_vllm" / "15_v1-0102-available-tokens-concurrency-tp1.log"
    code, out, err = run_cli(["analyze", str(log), "--model-config", str(QWEN3_14B), "--json"])
    t = json.loads(out)["targets"][0]
    assert t["startup"]["kv_geometry"]["bytes_per_token"] == 40 * 8 * 256 * 2 == 163840
    f = _codes(t)["kv_geometry"]
    assert f["severity"] == "info" and "match" in f["title"]
    wrong = tmp_path / "config.json"  # another model's: 48 layers
    wrong.write_text(json.dumps({**json.loads(QWEN3_14B.read_text()), "num_hidden_layers": 48}))
    code, out, err = run_cli(["analyze", str(log), "--model-config", str(wrong), "--json"])
    f = _codes(json.loads(out)["targets"][0])["kv_geometry_mismatch"]
    assert f["severity"] == "warning" and "196,608 B per token" in f["title"]


@pytest.mark.parametrize("cfg,tp,dtype,pp,want", [
    ({"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096}, 2, None, 1,
     4 * 256 * 32 * 2),  # Llama-3-8B at TP=2: 64 KiB per token per worker
    ({"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096}, 16, "fp8", 1,
     1 * 256 * 32 * 1),  # TP beyond the KV heads replicates them; fp8 is one byte
    ({"num_hidden_layers": 61, "num_attention_heads": 128, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
      "hidden_size": 7168}, 8, None, 1, 576 * 61 * 2),  # MLA: the latent, whole on every rank
    ({"num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8, "hidden_size": 8192}, 1, None, 4,
     8 * 256 * 20 * 2),  # PP=4: a stage's 20 layers
])
def test_vllm_paging_per_worker(cfg, tp, dtype, pp, want):
    from kvforensics.agent.vllm.kv_geometry import geometry

    assert geometry(cfg, tp, dtype, pp).bytes_per_token == want


def test_a_hybrid_config_is_not_reduced_to_one_figure():
    from kvforensics.agent.model.geometry import GeometryError
    from kvforensics.agent.vllm.kv_geometry import geometry

    with pytest.raises(GeometryError, match="hybrid"):
        geometry({"num_hidden_layers": 48, "num_attention_heads": 32, "hidden_size": 4096,
                  "layer_types": ["sliding_attention", "full_attention"] * 24})


# --- what a review found: each case is a node shape or input that misled the first version -------------

SPAWN = ["/usr/bin/python3", "-c", "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5)",
         "--multiprocessing-fork"]


def _proc_tree(root, procs):
    """A /proc tree of (pid, ppid, argv) for the process scan."""
    for pid, ppid, argv in procs:
        d = root / "proc" / str(pid)
        d.mkdir(parents=True)
        (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
        (d / "stat").write_text("{} (x) S {} {}\n".format(pid, ppid, " ".join(["0"] * 20)))
        (d / "status").write_text("Uid:\t0\t0\t0\t0\n")
    return str(root)


def _shape(tmp_path, procs):
    return [(e["kind"], e["server"] and e["server"]["pid"], [(w["pid"], w["rank"]) for w in e["schedulers"]])
            for e in engines.collect(_proc_tree(tmp_path, procs))["engines"]]


@pytest.mark.parametrize("procs,want", [
    # a wrapper that stays the parent (sudo, timeout, uv run) is not the server: the process it runs is
    ([(100, 1, ["sudo", "vllm", "serve", "m"]), (101, 100, ["/usr/bin/python3", "/usr/bin/vllm", "serve", "m"]),
      (102, 101, ["VLLM::EngineCore"])], [("vllm", 101, [(102, "EngineCore")])]),
    ([(100, 1, ["sudo", "python", "-m", "sglang.launch_server", "--tp", "2"]),
      (101, 100, ["python", "-m", "sglang.launch_server", "--tp", "2"]), (102, 101, ["sglang::scheduler_TP0"])],
     [("sglang", 101, [(102, "TP0")])]),
    # a V0 rank forked from the server keeps its command line exactly: a worker, not a second server
    ([(100, 1, ["timeout", "1d", "vllm", "serve", "m"]), (101, 100, ["python3", "/usr/bin/vllm", "serve", "m"]),
      (102, 101, ["python3", "/usr/bin/vllm", "serve", "m"])], [("vllm", 101, [(102, "")])]),
    # a training job's spawn workers beside a vLLM server are not the server's
    ([(200, 1, ["vllm", "serve", "a"]), (201, 200, ["VLLM::EngineCore"]), (900, 1, ["python", "train.py"]),
      (901, 900, SPAWN)], [("vllm", 200, [(201, "EngineCore")])]),
    # Ray's actors hang below the raylet: the node's one vLLM server owns them
    ([(200, 1, ["vllm", "serve", "a"]), (400, 1, ["raylet"]), (500, 400, ["ray::RayWorkerWrapper.execute_method"])],
     [("vllm", 200, [(500, "RayWorkerWrapper")])]),
    # 0.10.1 appends the rank to a spawned worker's title
    ([(200, 1, ["vllm", "serve", "a"]), (201, 200, SPAWN[:-1] + ["--multiprocessing-fork_TP1"])],
     [("vllm", 200, [(201, "TP1")])]),
])
def test_process_tree_shapes(tmp_path, procs, want):
    assert _shape(tmp_path, procs) == want


def test_the_running_servers_fraction_beats_an_older_logs(tmp_path, fake_lib, monkeypatch):
    """The server runs with u 0.95; the log (the 0.27 template) is from a run at 0.9."""
    with FakeVllmNode(tmp_path, tp=2, utilization=0.95, free_bytes=[10 * GIB] * 2) as n:
        monkeypatch.setenv("FAKE_NVML_SCENARIO", str(n.scenario))
        t = _inspect()
    room = _room(n, 0.95)
    assert room < 10 * GIB and _codes(t)["unused_gpu_memory"]["bytes"] == room - MARGIN
    rec = t["recommendations"][0]
    assert "u 0.95 from the running server" in rec["rationale"] and float(rec["value"]) > 0.95


def test_a_fixed_kv_cache_size_leaves_no_fraction_to_raise(tmp_path, fake_lib, monkeypatch):
    """--kv-cache-memory-bytes sizes the KV cache directly: --gpu-memory-utilization does nothing, so no
    by-design room and no raise of it."""
    with FakeVllmNode(tmp_path, tp=2, extra_flags=["--kv-cache-memory-bytes", "58196806861"]) as n:
        monkeypatch.setenv("FAKE_NVML_SCENARIO", str(n.scenario))
        t = _inspect()
    assert "unused_gpu_memory" not in _codes(t)
    assert not any(r["flag"] == "--gpu-memory-utilization" for r in t["recommendations"])


def _bundle(tmp_path, change):
    doc = json.loads((ROOT / "examples" / "vllm-node.json").read_text())
    change(doc)
    path = tmp_path / "b.json"
    path.write_text(json.dumps(doc))
    code, out, err = run_cli(["inspect", "--from", str(path), "--json"])
    assert code in (0, 1), err
    return json.loads(out)["targets"][0]


def test_without_a_reserved_figure_there_is_no_unused_verdict(tmp_path):
    def no_reserved(doc):
        for g in doc["nvml"]["gpus"]:
            g["reserved_bytes"] = None
    t = _bundle(tmp_path, no_reserved)
    assert "unused_gpu_memory" not in _codes(t) and not t["recommendations"]


def test_a_log_of_the_other_engine_is_set_aside(tmp_path):
    def mixed(doc):
        for e in doc["engines"]["engines"]:
            e["kind"] = "sglang"
    t = _bundle(tmp_path, mixed)
    assert any(p["code"] == "engine_log.other_engine" for p in t["problems"]) and t["engine"]["name"] == "sglang"
    assert "the log is not used" in _codes(t)["engine_log_missing"]["detail"]  # why, not "no startup lines"


def test_v0_spawned_engine_process_runs_the_driver():
    """V0 from 0.6.0: the OpenAI server spawns the engine, an untitled child holding GPU 0 whose lines carry
    no prefix; the other rank prints its PID."""
    from kvforensics.agent.model.evidence import Engine, Process
    from kvforensics.agent.vllm.analysis import Analysis, Worker
    from kvforensics.agent.vllm.live import place

    def proc(pid):
        return Process(pid, False)

    engine = Engine(proc(100), ((proc(101), ""), (proc(102), "")), (), {}, 8000, {}, "vllm")
    workers = (Worker(rank="", available_kv_bytes=5 * GIB), Worker(rank="VllmWorkerProcess pid=102",
                                                                  available_kv_bytes=6 * GIB))
    analysis = Analysis.__new__(Analysis)
    object.__setattr__(analysis, "ranks", workers)
    placed = place(engine, analysis, {101: 0, 102: 1})
    assert placed[101][0] == "driver" and placed[101][1][0].bytes == 5 * GIB
    assert placed[102][0] == "VllmWorkerProcess" and placed[102][1][0].bytes == 6 * GIB
    # TP=3: two workers print the same name; the label adds the GPU (stable across restarts), never the PID
    engine = Engine(proc(100), ((proc(101), ""), (proc(102), ""), (proc(103), "")), (), {}, 8000, {}, "vllm")
    object.__setattr__(analysis, "ranks", workers + (Worker(rank="VllmWorkerProcess pid=103"),))
    placed = place(engine, analysis, {101: 0, 102: 1, 103: 2})
    assert [placed[p][0] for p in (101, 102, 103)] == ["driver", "VllmWorkerProcess GPU1", "VllmWorkerProcess GPU2"]


def test_a_data_parallel_launch_is_one_startup():
    """Each engine core prints its own banner (EngineCore_DP0, _DP1): one launch, not two startups."""
    from kvforensics.collectors.vllm.startups import segment_lines

    text = (ROOT / "tests" / "fixtures" / "fake_vllm" / "v1-0.27-tp2.log").read_text().format(
        server=1, core=2, tp0=3, tp1=4, port=8000).splitlines()
    banner = next(x for x in text if "Initializing a V1 LLM engine" in x)
    lines = text[:3] + [banner.replace("EngineCore_DP0 pid=2", "EngineCore_DP1 pid=5")] + text[3:]
    startups = segment_lines([(i + 1, 0, x) for i, x in enumerate(lines)])
    assert len(startups) == 1 and any(e.kind == "args" for e in startups[0].events)
    restarted = segment_lines([(i + 1, 0, x) for i, x in enumerate(text + text)])
    assert len(restarted) == 2


def test_checkpoint_fp8_kv_counts_only_from_0_14():
    from kvforensics.agent.model.geometry import GeometryError
    from kvforensics.agent.vllm.kv_geometry import geometry

    cfg = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096,
           "torch_dtype": "bfloat16", "quantization_config": {"kv_cache_quant_algo": "FP8"}}
    assert geometry(cfg, 1, "auto", 1, True).bytes_per_token == 8 * 256 * 32 * 1  # 0.14+: fp8
    assert geometry(cfg, 1, "auto", 1, False).bytes_per_token == 8 * 256 * 32 * 2  # before: the model's bf16
    with pytest.raises(GeometryError, match="0.14"):
        geometry(cfg, 1, "auto", 1, None)


def test_api_keys_in_vllms_argument_list_are_redacted():
    from kvforensics.collectors.redact import redact_mapping, redact_text

    line = "non-default args: {'model': 'm', 'api_key': ['sk-live-SECRET'], 'max_num_batched_tokens': 8192}"
    assert "sk-live" not in redact_text(line) and "8192" in redact_text(line)
    assert redact_mapping({"api_key": 123456, "max_model_len": 4096}) == {"api_key": "<redacted>",
                                                                         "max_model_len": 4096}


def test_in_v1_before_0_9_1_other_processes_are_inside_the_budget():
    """V1-a (0.8.x gpu_worker.py determine_available_memory): the non-torch figure is the device's whole
    non-torch use, other processes and the context included, so the room beside the engine is T − T·u."""
    from kvforensics.agent.model.records import Options
    from kvforensics.agent.vllm.analysis import build_analysis
    from kvforensics.collectors.vllm.startups import segment_lines

    stamp = "INFO 05-01 10:00:0{} "
    lines = [stamp.format(0) + "[gpu_model_runner.py:1000] Model loading took 15.0000 GB and 10.000000 seconds",
             stamp.format(1) + "[kv_cache_utils.py:500] GPU KV cache size: 442,368 tokens",
             stamp.format(2) + "[kv_cache_utils.py:501] Maximum concurrency for 8,192 tokens per request: 54.00x",
             stamp.format(3) + "[gpu_model_runner.py:1001] Graph capturing finished in 5 secs, took 0.50 GiB",
             stamp.format(4) + "[core.py:100] init engine (profile, create kv cache, warmup model) took 30.00 seconds"]
    a = build_analysis(segment_lines([(i + 1, 0, x) for i, x in enumerate(lines)])[0], "t", Options())
    assert a.era.name == "V1-a"
    ceiling, how, others_inside = a.process_ceiling(80 * GIB, {"gpu_memory_utilization": 0.9})
    # V1 ≤ 0.9.0 captures graphs after KV sizing (0.8.x gpu_worker.py compile_or_warm_up_model after
    # initialize_cache): the 0.50 GiB pool is outside T·u
    assert (ceiling, others_inside) == (int(80 * GIB * 0.9) + GIB // 2, True) and "inside it in this era" in how
    assert "CUDA graph pool outside the budget" in how


def test_the_second_review(tmp_path):
    """What a second review found, on the example bundle: a human-readable --kv-cache-memory-bytes also
    fixes the KV size; the verdict explains the KV size by the fraction's meaning, not by a process
    beside it; a forged tiny GPU total does not hang the terminal bars."""
    def kv_bytes(doc):
        doc["engines"]["engines"][0]["server_args"]["kv_cache_memory_bytes"] = "50G"
    t = _bundle(tmp_path, kv_bytes)
    assert "unused_gpu_memory" not in _codes(t) and not t["recommendations"]
    assert "fixed by --kv-cache-memory-bytes" in _codes(t)["foreign_gpu_process"]["detail"]
    assert t["verdict"]["cause_finding"] == "gpu_memory_utilization_semantics"

    def tiny(doc):
        doc["nvml"]["gpus"][0]["total_bytes"] = 1
    path = tmp_path / "tiny.json"
    doc = json.loads((ROOT / "examples" / "vllm-node.json").read_text())
    tiny(doc)
    path.write_text(json.dumps(doc))
    code, out, err = run_cli(["inspect", "--from", str(path), "--detail"])
    assert code in (0, 1) and "GPU 0" in out, err


def test_a_v0_banner_is_read():
    """0.7.3–0.9.x print 'Initializing a V0 LLM engine (v0.8.5)' beside V1's banner."""
    from kvforensics.collectors.vllm.log import parse_line

    (ev,) = [e for e in parse_line("INFO 05-01 10:00:00 [llm_engine.py:240] Initializing a V0 LLM engine (v0.8.5) "
                                   "with config: model='m', max_seq_len=4096, tensor_parallel_size=2")
             if e.kind == "engine_config"]
    assert ev.data["version"] == "0.8.5" and ev.data["v1"] is False and ev.data["tensor_parallel_size"] == 2


def test_a_port_that_runs_no_server_is_said_so(tmp_path, fake_lib, monkeypatch):
    """The port asked for is one this test holds bound (never listening) for the whole test: no fake
    server of a concurrent run can be started on it (the fake SGLang node takes --port 1)."""
    import socket

    with socket.socket() as held, FakeVllmNode(tmp_path, tp=2) as n:
        held.bind(("127.0.0.1", 0))
        monkeypatch.setenv("FAKE_NVML_SCENARIO", str(n.scenario))
        t = _inspect("--engine", str(held.getsockname()[1]))
        port = n.port
    f = _codes(t)["engine_not_found"]
    assert f["severity"] == "warning" and str(port) in f["detail"] and "pass --engine" in t["verdict"]["action"]


def test_release_clues_that_contradict_each_other_are_said_so(tmp_path):
    """A v0.20.0 banner beside lines only 0.27+ prints: no era, a problem, no impossible range."""
    text = (ROOT / "tests" / "fixtures" / "fake_vllm" / "v1-0.27-tp2.log").read_text().format(
        server=1, core=2, tp0=3, tp1=4, port=8000).replace("LLM engine (v0.27.0)", "LLM engine (v0.20.0)")
    log = tmp_path / "conflict.log"
    log.write_text(text)
    code, out, err = run_cli(["analyze", str(log), "--json"])
    t = json.loads(out)["targets"][0]
    assert t["engine"]["era"] is None and "conflicting clues" in t["engine"]["version_hint"]
    assert any(p["code"] == "log.version_conflict" for p in t["problems"])


def test_an_api_servers_own_context_beside_the_worker_is_not_room(tmp_path):
    """If the API server process holds a CUDA context on a worker's GPU, that memory is the engine's but
    outside the worker's T·u: it comes off the by-design room too."""
    ctx = 3 * GIB  # more than the 2 GiB job beside GPU 1, so GPU 0 binds

    def api_context(doc):
        server = doc["engines"]["engines"][0]["server"]["pid"]
        gpu = doc["nvml"]["gpus"][0]
        gpu["processes"].append({"pid": server, "used_bytes": ctx, "type": "compute"})
        gpu["used_bytes"] += ctx
        gpu["free_bytes"] -= ctx
    node = FakeVllmNode(tmp_path)
    t = _bundle(tmp_path, api_context)
    assert t["gpus"][0]["rank"] == "Worker_TP0"  # the worker still names the GPU
    assert _codes(t)["unused_gpu_memory"]["bytes"] == _room(node, 0.9, others=ctx) - MARGIN
    assert "on GPU 0" in _codes(t)["unused_gpu_memory"]["detail"]
