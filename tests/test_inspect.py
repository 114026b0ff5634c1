"""kvforensics inspect on a fake node: fake NVML driver + real processes + a real log."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli
from tests.fakenode import FAKE_LIB, GIB, MIB, RESERVED, TOTAL, FakeNode, build_fake_nvml
from tests.loopback_http import serving


@pytest.fixture(scope="session")
def fake_lib() -> Path:
    return build_fake_nvml()


@pytest.fixture
def node(tmp_path, fake_lib, monkeypatch):
    with FakeNode(tmp_path, foreign={3: 2 * GIB}, orphan={5: GIB}) as n:
        monkeypatch.setenv("FAKE_NVML_SCENARIO", str(n.scenario))
        yield n


def _inspect(*extra):
    code, out, err = run_cli(["inspect", "--json", "--nvml-lib", str(FAKE_LIB), "--no-http", *extra])
    assert out, err
    return code, json.loads(out)["targets"][0], err


def _codes(t):
    out = {}
    for f in t["findings"]:
        out.setdefault(f["code"], f)
    return out


def test_seed_node_end_to_end_as_a_process(node):
    """The CLI as a separate process finds libnvidia-ml.so.1 on the loader path, like the real one."""
    env = dict(node.env(), LD_LIBRARY_PATH=str(FAKE_LIB.parent), PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "kvforensics", "inspect", "--json", "--no-http"], capture_output=True,
                          text=True, env=env, timeout=60, cwd=str(ROOT))
    assert proc.returncode == 1, proc.stderr  # findings at warning and above
    t = json.loads(proc.stdout)["targets"][0]
    assert t["status"] == "ok" and t["target"].startswith("local:")
    assert len(t["gpus"]) == 8
    for i, g in enumerate(t["gpus"]):
        assert g["index"] == i and g["rank"] == "TP{}".format(i)
        assert g["total_bytes"] == TOTAL and g["reserved_bytes"] == RESERVED
        assert g["free_bytes"] == int(5.06 * GIB)
        assert g["used_bytes"] == TOTAL - RESERVED - int(5.06 * GIB)
        engine = [p for p in g["processes"] if p["owner"] == "engine"]
        assert len(engine) == 1 and engine[0]["pid"] == node.scheduler_pids[i] and engine[0]["rank"] == "TP{}".format(i)
        assert sum(x["bytes"] for x in g["ledger"] if x["item"] not in ("reserved by the driver",
                                                                        "free")) == g["used_bytes"]
    # the log's ledger is joined per GPU
    ledger0 = {x["item"]: x["bytes"] for x in t["gpus"][0]["ledger"]}
    assert ledger0["weights"] == int(round(72.33 * GIB)) and ledger0["KV pool"] == int(round(10.42 * GIB))
    assert ledger0["draft model"] > 3 * GIB
    assert t["startup"]["max_total_num_tokens"] == 159277
    assert t["startup"]["budget"]["bytes_per_token"] == 70272  # config.json found from --model-path
    assert t["host_memory"]["total_bytes"] > 0 and t["host_memory"]["available_bytes"] > 0
    assert "sk-do-not-print" not in proc.stdout  # --api-key on the command line never leaks


def test_findings_and_measured_recommendations(node):
    code, t, err = _inspect()
    assert code == 1
    f = _codes(t)
    spare = int(5.06 * GIB) - 2 * GIB
    assert f["unused_gpu_memory"]["bytes"] == spare
    assert "8 GPU(s)" in f["unused_gpu_memory"]["title"]
    foreign = f["foreign_gpu_process"]
    assert foreign["bytes"] == 2 * GIB and str(node.foreign_pids[3]) in foreign["title"]
    assert "{:,} KV tokens per rank".format(2 * GIB // 70272) in foreign["detail"]
    assert "all 8 rank(s)" in foreign["detail"]
    orphan = f["orphaned_gpu_memory"]
    assert orphan["severity"] == "error" and orphan["bytes"] == GIB and "4194005" in orphan["title"]
    for code_ in ("mem_fraction_semantics", "kv_budget_check", "draft_in_reserve", "concurrency_bound"):
        assert code_ in f
    rec = next(r for r in t["recommendations"] if r["flag"] == "--mem-fraction-static")
    assert rec["basis"] == "estimated"  # one look at NVML, no recorded history: not a measurement
    assert "one look" in rec["rationale"] and "one look" in f["unused_gpu_memory"]["detail"]
    pre = int(round(94.04 * GIB))
    assert float(rec["value"]) == int((0.88 + spare / pre) * 1000) / 1000
    assert rec["gain_tokens"] == rec["gain_bytes"] // 70272
    # one number, one value: the finding quotes the recommendation's GiB and tokens
    assert "--mem-fraction-static {} puts {:.2f} GiB of it into the KV pool: +{:,} KV tokens per rank".format(
        rec["value"], rec["gain_bytes"] / GIB, rec["gain_tokens"]) in f["unused_gpu_memory"]["detail"]
    gpu5 = {x["item"]: x["bytes"] for x in t["gpus"][5]["ledger"]}
    assert gpu5["PIDs that no longer exist"] == GIB


def test_rank_imbalance_live(tmp_path, fake_lib, monkeypatch):
    free = [int(5.06 * GIB)] * 8
    free[6] = int(1.5 * GIB)
    with FakeNode(tmp_path, free_bytes=free) as n:
        monkeypatch.setenv("FAKE_NVML_SCENARIO", str(n.scenario))
        code, t, _ = _inspect()
    f = _codes(t)
    assert f["rank_imbalance"]["bytes"] == int(5.06 * GIB) - int(1.5 * GIB)
    assert "GPU 6" in f["rank_imbalance"]["detail"]
    assert f["low_headroom"]["bytes"] == int(1.5 * GIB)  # the minimum decides, and it is below the margin
    # one look at NVML is no evidence of pressure: no cut (tests/test_record.py cuts on a measured low-water mark)
    assert f["low_headroom"]["severity"] == "info"
    assert not [r for r in t["recommendations"] if r["flag"] == "--mem-fraction-static"]


@pytest.mark.parametrize("directive,check", [
    ("memory_api v1",
     lambda t: t["gpus"][0]["reserved_bytes"] is None and t["gpus"][0]["used_bytes"] == TOTAL - int(5.06 * GIB)),
    ("process_api v2", lambda t: t["gpus"][0]["processes"][0]["rank"] == "TP0"),
    ("process_api v1", lambda t: t["gpus"][0]["processes"][0]["rank"] == "TP0"),
    ("process_api cc", lambda t: t["gpus"][0]["processes"][0]["rank"] == "TP0"
                                 and any(p["code"] == "nvml.process_list_corrupt" for p in t["problems"])),
])
def test_driver_generations(node, directive, check):
    text = node.scenario.read_text()
    node.scenario.write_text(directive + "\n" + text)
    code, t, _ = _inspect()
    assert check(t), t["gpus"][0]
    assert all(len([p for p in g["processes"] if p["owner"] == "engine"]) == 1 for g in t["gpus"])


def test_lost_gpu_is_critical_and_others_still_reported(node):
    node.scenario.write_text(node.scenario.read_text().replace("gpu 2 ", "gpu 2 state=lost ", 1))
    code, t, _ = _inspect()
    assert code == 1
    assert t["gpus"][2]["status"] == "lost" and t["gpus"][2]["total_bytes"] is None
    assert t["gpus"][3]["total_bytes"] == TOTAL
    f = _codes(t)["gpu_lost"]
    assert f["severity"] == "critical" and "GPU 2" in f["title"]
    assert t["status"] == "partial"


def test_field_not_supported_is_none_not_zero(node):
    node.scenario.write_text(node.scenario.read_text().replace("gpu 1 ", "gpu 1 memory=not_supported ", 1))
    code, t, _ = _inspect()
    g = t["gpus"][1]
    assert g["total_bytes"] is None and g["free_bytes"] is None and g["status"] == "partial"
    assert any("memory" in p["message"] for p in g["problems"])


@pytest.mark.parametrize("init,message", [
    ("driver_not_loaded", "kernel driver is not loaded"),
    ("rm_version_mismatch", "versions differ"),
    ("no_permission", "no permission to open the NVIDIA devices"),
])
def test_init_errors_are_one_clear_sentence(node, init, message):
    node.scenario.write_text("init {}\n".format(init) + node.scenario.read_text())
    code, t, _ = _inspect()
    f = _codes(t)["nvml_unavailable"]
    assert message in f["title"]
    assert t["gpus"] == [] and t["host_memory"]["total_bytes"] > 0
    assert code == 1  # the host and the engine were still collected: not exit 3


def test_no_driver_on_this_machine(monkeypatch):
    monkeypatch.delenv("FAKE_NVML_SCENARIO", raising=False)
    code, out, err = run_cli(["inspect", "--json", "--no-http", "--nvml-lib", "/nonexistent/libnvidia-ml.so.1"])
    t = json.loads(out)["targets"][0]
    assert code == 1 and t["gpus"] == []
    assert _codes(t)["nvml_unavailable"]["severity"] == "warning"
    assert t["host_memory"]["available_bytes"] > 0
    code, out, err = run_cli(["inspect", "--no-color", "--no-http", "--nvml-lib", "/nonexistent/x.so"])
    assert "WARNING  No GPU information: " in out and "host RAM" in out  # the finding's line, on one screen
    code, out, err = run_cli(["inspect", "--no-color", "--no-http", "--nvml-lib", "/nonexistent/x.so", "--detail"])
    assert "nvml_unavailable" in out and "host RAM" in out


def test_bundle_round_trip(node, tmp_path):
    bundle = tmp_path / "evidence.json"
    code, live, _ = _inspect("--save", str(bundle))
    data = json.loads(bundle.read_text())
    assert data["schema"] == "kvforensics.snapshot/1"
    assert data["nvml"]["gpus"][0]["total_bytes"] == TOTAL
    assert data["engine_log"]["lines"] and "sk-do-not-print" not in bundle.read_text()
    node.stop()  # the node is gone; the bundle still tells the story
    code2, out, err = run_cli(["inspect", "--from", str(bundle), "--json"])
    replay = json.loads(out)["targets"][0]
    assert replay["target"] == "bundle:" + str(bundle)
    assert replay["findings"] == live["findings"] and replay["recommendations"] == live["recommendations"]
    assert replay["gpus"] == live["gpus"]


@pytest.mark.parametrize("content,message", [("not json", "not JSON"), ('{"schema": "other"}',
                                                                        "not a kvforensics bundle")])
def test_bad_bundles(tmp_path, content, message):
    p = tmp_path / "b.json"
    p.write_text(content)
    code, out, err = run_cli(["inspect", "--from", str(p)])
    assert code == 2 and message in err and err.count("\n") == 1


def test_shipped_seed_bundle():
    code, out, err = run_cli(["inspect", "--from", str(ROOT / "examples" / "seed-node.json"), "--json"])
    t = json.loads(out)["targets"][0]
    assert code == 1
    assert len(t["gpus"]) == 8 and all(g["total_bytes"] == 97887 * MIB for g in t["gpus"])
    assert all(4.5 * GIB < g["free_bytes"] < 5.5 * GIB for g in t["gpus"])
    assert 390 * GIB < t["host_memory"]["available_bytes"] < 400 * GIB
    f = _codes(t)
    assert {"unused_gpu_memory", "mem_fraction_semantics", "draft_in_reserve", "host_ram_offload"} <= set(f)
    hicache = next(r for r in t["recommendations"] if r["flag"].startswith("--enable-hierarchical-cache"))
    assert hicache["basis"] == "estimated"  # one look at MemAvailable
    per_rank = (t["host_memory"]["available_bytes"] - 10 * GIB) // 8
    assert int(hicache["value"]) == per_rank // 10**9


@pytest.mark.parametrize("value", ["journal:x;touch owned", "docker:$(touch owned)", "journal:-o", "docker:"])
def test_hostile_log_values_never_run_anything(tmp_path, value, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["inspect", "--log", value, "--no-http"])
    assert code == 2 and "--log" in err
    assert not (tmp_path / "owned").exists()


class _Engine(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        bodies = {
            "/server_info": json.dumps({"max_total_num_tokens": 159277, "api_key": "sk-http-secret",
                                        "internal_states": [{"memory_usage": {"kvcache": 10.42}}]}),
            "/metrics": "# HELP sglang:num_running_reqs x\nsglang:num_running_reqs{tp_rank=\"0\"} 17.0\n"
                        "sglang:num_queue_reqs{tp_rank=\"0\"} 5.0\nsglang:token_usage{tp_rank=\"0\"} 0.93\n",
        }
        body = bodies.get(self.path)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args):
        pass


def test_live_metrics_from_the_engine_on_loopback(tmp_path, fake_lib, monkeypatch):
    with serving(_Engine) as port, FakeNode(tmp_path, extra_flags=["--port", str(port)]) as n:
        monkeypatch.setenv("FAKE_NVML_SCENARIO", str(n.scenario))
        code, out, err = run_cli(["inspect", "--json", "--nvml-lib", str(FAKE_LIB), "--save", str(tmp_path / "b.json")])
    t = json.loads(out)["targets"][0]
    f = _codes(t)["concurrency_bound"]
    assert "running 17" in f["detail"] and "queued 5" in f["detail"] and "KV token usage 93%" in f["detail"]
    assert f["severity"] == "warning"  # requests are queueing
    assert "sk-http-secret" not in (tmp_path / "b.json").read_text()


def test_help_mentions_inspect():
    code, out, _ = run_cli(["inspect", "--help"])
    assert code == 0 and "--nvml-lib" in out and "--save" in out and "--from" in out


def test_two_engines_on_one_node(tmp_path, fake_lib, monkeypatch):
    """Two servers, TP4 each (port A on GPUs 0-3, port B on GPUs 4-7): neither is 'foreign'. The ports are
    ones this test holds bound, so another copy of the suite running its own fake servers never uses them."""
    with contextlib.ExitStack() as held:
        port_a, port_b, unused = (_held_port(held) for _ in range(3))
        _two_engines(tmp_path, monkeypatch, port_a, port_b, unused)


def _held_port(stack: contextlib.ExitStack) -> int:
    sock = stack.enter_context(socket.socket())
    sock.bind(("127.0.0.1", 0))
    return sock.getsockname()[1]


def _two_engines(tmp_path, monkeypatch, port_a: int, port_b: int, unused: int) -> None:
    a = FakeNode(tmp_path / "a", tp=4, extra_flags=["--port", str(port_a)])
    b = FakeNode(tmp_path / "b", tp=4, extra_flags=["--port", str(port_b)])
    a.start()
    try:
        b.start()
        try:
            lines = ["driver 580.95.05"]
            for gpu in range(8):
                node, rank = (a, gpu) if gpu < 4 else (b, gpu - 4)
                used = (80 if node is a else 70) * GIB
                lines.append("gpu {} uuid=GPU-{} name=X bus=00000000:{:02X}:00.0 total={} reserved={} used={}".format(
                    gpu, gpu, 0x18 + gpu, TOTAL, RESERVED, used))
                lines.append("proc {} compute {} {}".format(gpu, node.scheduler_pids[rank], used))
            scenario = tmp_path / "two.txt"
            scenario.write_text("\n".join(lines) + "\n")
            monkeypatch.setenv("FAKE_NVML_SCENARIO", str(scenario))
            code, default, _ = _inspect()
            code, second, _ = _inspect("--engine", str(port_b))
            code, missing, _ = _inspect("--engine", str(unused))
        finally:
            b.stop()
    finally:
        a.stop()
    codes = _codes(default)
    assert "foreign_gpu_process" not in codes
    assert "port {} (".format(port_b) in codes["other_engines"]["detail"]
    assert "GPU 4,5,6,7" in codes["other_engines"]["detail"]
    assert [g["rank"] for g in default["gpus"]] == ["TP0", "TP1", "TP2", "TP3", None, None, None, None]
    assert {p["owner"] for g in default["gpus"][4:] for p in g["processes"]} == {"other_engine"}
    assert default["gpus"][5]["ledger"][0] == {"item": "other inference servers", "bytes": 70 * GIB,
                                               "source": "NVML process list: another server's schedulers"}
    assert [g["rank"] for g in second["gpus"]] == [None, None, None, None, "TP0", "TP1", "TP2", "TP3"]
    assert "port {} (".format(port_a) in _codes(second)["other_engines"]["detail"]
    ports_seen = next(p["message"] for p in missing["problems"] if p["code"] == "engines.port_not_found")
    assert str(port_a) in ports_seen and str(port_b) in ports_seen  # (another copy's servers may be listed too)
    assert all(g["rank"] is None for g in missing["gpus"])


def test_inside_a_pid_namespace_host_pids_are_not_orphans(tmp_path):
    """kvforensics in a container: a real PID namespace (unshare --pid --fork --mount-proc) around the
    inspect, the fake node outside it. NVML reports the node's (host) PIDs, which this /proc cannot
    show: they are in another PID namespace, never orphaned memory."""
    import shutil
    import subprocess

    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare to make a PID namespace")
    with FakeNode(tmp_path / "node") as node:
        env = dict(os.environ, FAKE_NVML_SCENARIO=str(node.scenario), PYTHONPATH=str(ROOT))
        done = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-m", "kvforensics",
                               "inspect",
                               "--json", "--no-http", "--nvml-lib", str(FAKE_LIB)], capture_output=True, text=True,
                              env=env, timeout=120)
        if done.returncode not in (0, 1, 3) or not done.stdout.strip():
            pytest.skip("this kernel refuses PID namespaces here: " + done.stderr.strip()[:200])
    (t,) = json.loads(done.stdout)["targets"]
    codes = [f["code"] for f in t["findings"]]
    assert "orphaned_gpu_memory" not in codes and "pid_namespace" in codes
    owners = {p["owner"] for g in t["gpus"] for p in g["processes"]}
    assert owners == {"other_namespace"}


def test_nested_namespace_pids_map_through_nspid(tmp_path):
    """From the host, a PID numbered inside a container's namespace is found through NSpid."""
    from kvforensics.collectors import procfs

    proc = tmp_path / "proc" / "4242"
    proc.mkdir(parents=True)
    (proc / "status").write_text("Name:\tpython\nNSpid:\t4242\t17\n")
    assert procfs.parse_nspid("NSpid:\t4242\t17\t3\n") == [4242, 17, 3]
    assert procfs.nspid_index(str(tmp_path)) == {17: 4242}


@pytest.mark.parametrize("bundle", ["seed-node.json", "vllm-node.json"])
def test_mutated_bundles_are_one_line_errors_never_crashes(tmp_path, bundle):
    """5% of a real bundle's values swapped for wrong types, huge numbers, deep nesting: exit 0/1/2
    with one line, never 4; what loads validates against the snapshot schema."""
    import random

    seed = json.loads((ROOT / "examples" / bundle).read_text())
    rng = random.Random(11)
    hostile = [None, "x", -1, 10**30, 1e308, [], {}, [[[[[[[[]]]]]]]], True, "9" * 5000]

    def mutate(value):
        if isinstance(value, dict):
            return {k: (rng.choice(hostile) if rng.random() < 0.05 else mutate(v)) for k, v in value.items()}
        if isinstance(value, list):
            return [rng.choice(hostile) if rng.random() < 0.05 else mutate(v) for v in value]
        return value

    path = tmp_path / "b.json"
    for _ in range(40):
        path.write_text(json.dumps(mutate(seed)))
        code, out, err = run_cli(["inspect", "--from", str(path), "--json"])
        assert code in (0, 1, 2), err
        if code == 2:
            assert err.count("\n") == 1 and "Traceback" not in err
    nested = tmp_path / "deep.json"
    nested.write_text('{"schema": "kvforensics.snapshot/1", "x": ' + "[" * 100000 + "]" * 100000 + "}")
    code, out, err = run_cli(["inspect", "--from", str(nested)])
    assert code == 2 and "not a kvforensics bundle" in err
