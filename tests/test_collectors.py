"""Collector units: SGLang flags, /proc parsing, host memory and cgroups, log discovery."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from kvforensics.collectors import engine_http, engine_logs, host_memory, procfs
from kvforensics.collectors.redact import REDACTED, redact_argv, redact_mapping
from kvforensics.collectors.sglang import http as sglang_http
from kvforensics.collectors.sglang import processes as sglang_processes
from tests.conftest import ROOT, SEED_LOG


@pytest.mark.parametrize("argv,expected", [
    (["--model-path", "/m", "--tp", "8", "--mem-fraction-static", "0.88"], {"model_path": "/m", "tp_size": 8,
                                                                            "mem_fraction_static": 0.88}),
    (["--model", "org/name", "--tensor-parallel-size=4", "--dp", "2"], {"model_path": "org/name", "tp_size": 4,
                                                                        "dp_size": 2}),
    (["--mem-frac", "0.9", "--max-running", "64"], {"mem_fraction_static": 0.9, "max_running_requests": 64}),
    (["--enable-hicache", "--trust-remote-code", "--page-size", "64"], {"enable_hierarchical_cache": True,
                                                                        "trust_remote_code": True, "page_size": 64}),
    (["--enable-dp-attention", "--disable-cuda-graph", "--kv-cache-dtype", "fp8_e4m3"], {"enable_dp_attention": True,
                                                                                         "disable_cuda_graph": True,
                                                                                         "kv_cache_dtype": "fp8_e4m3"}),
    (["moonshotai/Kimi-K2.5", "--tp-size", "8"], {"model_path": "moonshotai/Kimi-K2.5", "tp_size": 8}),
    (["--speculative-algorithm", "EAGLE3", "--speculative-num-draft-tokens", "4"], {"speculative_algorithm": "EAGLE3",
                                                                                    "speculative_num_draft_tokens": 4}),
])
def test_flags_like_argparse(argv, expected):
    assert sglang_processes.parse_flags(argv) == expected


def test_ambiguous_prefix_is_kept_as_given():
    # --max could be --max-total-tokens, --max-running-requests or --max-prefill-tokens
    assert sglang_processes.parse_flags(["--max", "5"]) == {"max": 5}


@pytest.mark.parametrize("argv,role", [
    (["python3", "-m", "sglang.launch_server", "--tp", "8"], "server"),
    (["/usr/bin/python3", "/opt/sglang/python/sglang/launch_server.py"], "server"),
    (["/opt/venv/bin/sglang", "serve", "--model-path", "/m"], "server"),
    (["sglang::scheduler_DP1_TP3"], "worker"),
    (["sglang::scheduler"], "worker"),
    (["sglang::detokenizer"], "helper"),
    (["python3", "train.py"], None),
    (["vim", "sglang.launch_server.md"], None),
])
def test_classify(argv, role):
    kind = sglang_processes.classify(argv)
    assert (kind or {}).get("role") == role
    if argv[0] == "sglang::scheduler_DP1_TP3":
        assert kind["rank"] == "DP1 TP3"
    if argv[0] == "sglang::scheduler":
        assert kind["rank"] == ""


def test_redaction():
    assert redact_argv(["--api-key", "sk-1", "--tp", "8", "--admin-api-key=adm"]) == \
        ["--api-key", REDACTED, "--tp", "8", "--admin-api-key=" + REDACTED]
    data = {"api_key": "x", "hf_token": "y", "max_total_tokens": 5, "tokenizer_path": "/t",
            "nested": [{"password": "p"}],
            "speculative_num_draft_tokens": 4}
    assert redact_mapping(data) == {"api_key": REDACTED, "hf_token": REDACTED, "max_total_tokens": 5,
                                    "tokenizer_path": "/t", "nested": [{"password": REDACTED}],
                                    "speculative_num_draft_tokens": 4}


@pytest.mark.parametrize("text,container,unit", [
    ("0::/system.slice/docker-" + "a" * 64 + ".scope\n", {"runtime": "docker", "id": "a" * 64}, None),
    ("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12345678_1234_1234_1234_123456789abc.slice"
     "/cri-containerd-" + "b" * 64 + ".scope\n",
     {"runtime": "containerd", "id": "b" * 64, "pod_uid": "12345678-1234-1234-1234-123456789abc", "qos": "burstable"},
     None),
    ("0::/system.slice/sglang-kimi.service\n", None, "sglang-kimi.service"),
    ("12:memory:/docker/" + "c" * 64 + "\n0::/\n", {"runtime": "docker", "id": "c" * 64}, None),
    ("0::/user.slice/user-0.slice/session-3.scope\n", None, None),
])
def test_cgroup_parsing(text, container, unit):
    _, got_container, got_unit = procfs.parse_cgroup(text)
    assert got_container == container and got_unit == unit


def test_stat_with_parentheses_in_comm():
    ppid, start = procfs.parse_stat("4242 (weird) name)) S 1 4242 4242 0 -1 4194560 "
                                    "" + " ".join(["0"] * 12) + " 123456 0 0")
    assert ppid == 1 and start == 123456


def _tree(root: Path, meminfo: str, cgroup: str = "0::/\n", files: dict = None) -> str:
    (root / "proc" / "self").mkdir(parents=True)
    (root / "proc" / "meminfo").write_text(meminfo)
    (root / "proc" / "self" / "cgroup").write_text(cgroup)
    for rel, content in (files or {}).items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(content)
    return str(root)


MEMINFO = ("MemTotal:       527426560 kB\nMemFree:        10000000 kB\nMemAvailable:   415236096 kB\n"
           "SwapTotal: 0 kB\nSwapFree: 0 kB\n")


def test_host_memory_from_meminfo(tmp_path):
    s = host_memory.collect(_tree(tmp_path, MEMINFO))
    assert s["total_bytes"] == 527426560 * 1024 and s["available_bytes"] == 415236096 * 1024
    assert s["cgroup_limit_bytes"] is None and s["status"] == "ok"


def test_host_memory_bounded_by_cgroup_v2(tmp_path):
    root = _tree(tmp_path, MEMINFO, "0::/kubepods/pod1\n", {
        "sys/fs/cgroup/kubepods/pod1/memory.max": str(64 << 30) + "\n",
        "sys/fs/cgroup/kubepods/pod1/memory.current": str(24 << 30) + "\n"})
    s = host_memory.collect(root)
    assert s["cgroup_limit_bytes"] == 64 << 30 and s["available_bytes"] == 40 << 30


def test_host_memory_unlimited_cgroup_v1(tmp_path):
    root = _tree(tmp_path, MEMINFO, "4:memory:/docker/x\n", {
        "sys/fs/cgroup/memory/docker/x/memory.limit_in_bytes": "9223372036854771712\n",
        "sys/fs/cgroup/memory/docker/x/memory.usage_in_bytes": "1000\n"})
    s = host_memory.collect(root)
    assert s["cgroup_limit_bytes"] is None and s["available_bytes"] == 415236096 * 1024


def test_host_memory_missing(tmp_path):
    s = host_memory.collect(str(tmp_path))
    assert s["status"] == "failed" and s["total_bytes"] is None


def test_host_memory_on_this_machine_matches_free():
    s = host_memory.collect("/")
    with open("/proc/meminfo") as f:
        total = int(next(line for line in f if line.startswith("MemTotal")).split()[1]) * 1024
    assert s["total_bytes"] == total


def test_log_source_from_the_process():
    assert engine_logs.spec_for({"pid": 1, "stdout": "file:/var/log/s.log"}) == (("file", "/var/log/s.log"), None)
    assert engine_logs.spec_for({"pid": 1, "stdout": "socket", "unit": "sglang.service"}) == (("journal",
                                                                                               "sglang.service"), None)
    assert engine_logs.spec_for({"pid": 1, "stdout": "pipe", "unit": None,
                                 "container": {"runtime": "docker", "id": "f" * 64}}) == (("docker", "f" * 12), None)
    spec, why = engine_logs.spec_for({"pid": 7, "stdout": "pipe", "unit": None, "container": None})
    assert spec is None and "pass --log" in why
    spec, why = engine_logs.spec_for({"pid": 7, "stdout": None})
    assert spec is None and "not readable" in why


def _stand_in(folder: Path, name: str, script: str) -> None:
    """journald and a Docker engine cannot run here: a stand-in command prints what they would."""
    path = folder / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_journal_reads_this_invocation_newest_first(tmp_path, monkeypatch):
    seed = SEED_LOG.read_text(encoding="utf-8").splitlines()
    older = [line.replace("#tokens: 159277", "#tokens: 111") for line in seed]  # a previous invocation
    journal = tmp_path / "journal.txt"
    journal.write_text("\n".join(older + seed) + "\n")
    calls = tmp_path / "calls.txt"
    _stand_in(tmp_path, "systemctl", 'echo "$@" >> {0}; echo 0123456789abcdef0123456789abcdef\n'.format(calls))
    _stand_in(tmp_path, "journalctl", 'echo "$@" >> {0}; tac {1}\n'.format(calls, journal))
    monkeypatch.setenv("PATH", str(tmp_path) + os.pathsep + os.environ["PATH"])
    s = engine_logs.collect(("journal", "sglang.service"))
    assert s["status"] == "ok" and s["source"] == "journal:sglang.service"
    raws = [r for _, _, r in s["lines"]]
    assert raws[0].startswith("[2026-01-20") and "server_args=" in raws[0]
    assert any("#tokens: 159277" in r for r in raws) and not any("#tokens: 111" in r for r in raws)
    argv = calls.read_text()
    assert "-u sglang.service" in argv and "_SYSTEMD_INVOCATION_ID=0123456789abcdef0123456789abcdef" in argv
    assert s["lines"][0][0] == 1


def test_journal_of_a_vllm_unit_stops_at_its_launch_line(tmp_path, monkeypatch):
    """vLLM's launch line is 'non-default args:' (0.10+): newest first, the read stops there, and the
    lines are split into startups by vLLM's own segmenter."""
    template = (ROOT / "tests" / "fixtures" / "fake_vllm" / "v1-0.27-tp2.log").read_text()
    older = template.format(server=10, core=11, tp0=12, tp1=13, port=8000).replace("54.2 GiB", "50.0 GiB")
    current = template.format(server=20, core=21, tp0=22, tp1=23, port=8000)
    journal = tmp_path / "journal.txt"
    journal.write_text(older + current)
    _stand_in(tmp_path, "systemctl", "echo 0123456789abcdef0123456789abcdef\n")
    _stand_in(tmp_path, "journalctl", "tac {}\n".format(journal))
    monkeypatch.setenv("PATH", str(tmp_path) + os.pathsep + os.environ["PATH"])
    s = engine_logs.collect(("journal", "vllm.service"), engine="vllm")
    assert s["status"] == "ok" and s["engine"] == "vllm"
    raws = [r for _, _, r in s["lines"]]
    assert "non-default args:" in raws[0] and all("pid=1" not in r for r in raws)  # this invocation only
    assert any("Available KV cache memory: 54.2 GiB" in r for r in raws)


def test_docker_logs(tmp_path, monkeypatch):
    _stand_in(tmp_path, "docker", 'cat {}\n'.format(SEED_LOG))
    monkeypatch.setenv("PATH", str(tmp_path) + os.pathsep + os.environ["PATH"])
    s = engine_logs.collect(("docker", "abc123"))
    assert s["status"] == "ok" and any("KV Cache is allocated" in r for _, _, r in s["lines"])


def test_missing_tools_are_a_clear_problem(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    s = engine_logs.collect(("journal", "sglang.service"))
    assert s["status"] == "failed" and "journalctl is not installed" in s["problems"][0]["message"]


def test_metrics_parser():
    text = ('# HELP x\nsglang:num_running_reqs{tp_rank="0",model_name="m"} 12.0\n'
            'sglang:num_running_reqs{tp_rank="1"} 12.0\nsglang:token_usage 0.5\nother_metric 3\n')
    assert sglang_http.parse_metrics(text) == {"sglang:num_running_reqs": 12.0, "sglang:token_usage": 0.5}
    # a NaN or infinite sample is not JSON: skipped, so the first finite one counts; a brace inside a
    # quoted label value is data
    hostile = ('sglang:token_usage NaN\nsglang:num_queue_reqs{model_name="a}b"} +Inf\n'
               'sglang:num_queue_reqs{model_name="a}b"} 3\nsglang:token_usage 0.25\n')
    assert sglang_http.parse_metrics(hostile) == {"sglang:token_usage": 0.25, "sglang:num_queue_reqs": 3.0}


def test_http_skips_non_loopback_hosts():
    s = engine_http.collect({"host": "10.1.2.3", "port": 30000}, engine="sglang")
    assert s["status"] == "absent" and s["url"] is None
    assert s["problems"][0]["code"] == "engine_http.not_loopback"


def test_secrets_in_raw_log_lines_are_redacted():
    from kvforensics.collectors.redact import redact_text

    repr_line = ("[2026-01-01 10:00:00] server_args=ServerArgs(model_path='/m', api_key='sk-live-1', "
                 "admin_api_key=\"adm\", tokenizer_path='/t', max_total_tokens=None)")
    out = redact_text(repr_line)
    assert "sk-live-1" not in out and "adm\"" not in out and "tokenizer_path='/t'" in out and "model_path='/m'" in out
    dict_line = "[2026-09-04 10:00:00] server_args={'api_key': 'sk-2', 'hf_token': 'hf_x', 'page_size': 64}"
    out = redact_text(dict_line)
    assert "sk-2" not in out and "hf_x" not in out and "'page_size': 64" in out


def test_bundle_never_holds_the_api_key_from_the_log(tmp_path, monkeypatch):
    from kvforensics.collectors import engine_logs
    from kvforensics.collectors.sglang.log import parse_line

    log = tmp_path / "s.log"
    text = SEED_LOG.read_text(encoding="utf-8").replace("api_key=None", "api_key='sk-from-the-log'")
    log.write_bytes(text.encode())
    section = engine_logs.collect(("file", str(log)))
    raw = "\n".join(r for _, _, r in section["lines"])
    assert "sk-from-the-log" not in raw and "api_key='<redacted>'" in raw
    (ev,) = parse_line(next(r for _, _, r in section["lines"] if "server_args=" in r))
    assert ev.data["args"]["mem_fraction_static"] == 0.88 and ev.data["args"]["api_key"] == "<redacted>"


def test_model_config_from_the_hugging_face_cache(tmp_path):
    from kvforensics.collectors import model_config

    snap = tmp_path / "hf" / "hub" / "models--moonshotai--Kimi-K2.5" / "snapshots" / "0123abcd"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text('{"num_hidden_layers": 61}')
    found = model_config.locate("moonshotai/Kimi-K2.5", {"HF_HOME": str(tmp_path / "hf")})
    assert found == str(snap / "config.json")
    assert model_config.locate("moonshotai/Other", {"HF_HOME": str(tmp_path / "hf")}) is None
    assert model_config.locate(str(snap)) == str(snap / "config.json")


def test_probe_written_for_review_runs_by_hand(tmp_path):
    import subprocess
    import sys

    from kvforensics.agent.remote import probe
    from tests.conftest import run_cli

    out = tmp_path / "probe.py"
    code, text, err = run_cli(["probe", "-o", str(out)])
    assert code == 0 and "sha256" in text
    proc = subprocess.run([sys.executable, "-I", "-"], input=out.read_bytes(), capture_output=True, timeout=60)
    assert proc.returncode == 0
    snap = probe.parse_answer(proc.stdout, probe.build({}))
    assert snap["schema"] == "kvforensics.snapshot/1"
