"""What on call sees first: every mistake in the command line said in one line with exit 2, the help on a
bare command, IPv6 hosts as typed, analyze's oneline, and the probe's own answer read back by --from.
(Failed SSH hosts, one line each whatever the format: tests/test_ssh.py.)"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from tests.conftest import ROOT, SEED_LOG, run_cli
from tests.fakenode import FAKE_LIB, FakeNode, build_fake_nvml

SEED_NODE = str(ROOT / "examples" / "seed-node.json")


@pytest.mark.parametrize("argv, line", [
    (["inspect", "--engine", "70000", "--from", SEED_NODE], "--engine takes the server's port, 1–65535, not 70000"),
    (["inspect", "--engine", "0"], "--engine takes the server's port, 1–65535, not 0"),
    (["record", "--engine", "65536", "--db", "/nonexistent/h.db"],
     "--engine takes the server's port, 1–65535, not 65536"),
    (["inspect", "root@gpu-07:70000"], "root@gpu-07:70000: port '70000' is not 1–65535"),
    (["inspect", "gpu-01", "gpu-02:0"], "gpu-02:0: port '0' is not 1–65535"),  # before gpu-01 is contacted
    (["inspect", "[::1]:99999"], "[::1]:99999: port '99999' is not 1–65535"),
    (["inspect", "gpu-[1-2]:70000"], "gpu-1:70000: port '70000' is not 1–65535"),
])
def test_impossible_ports_are_usage_errors(argv, line):
    code, out, err = run_cli(argv)
    assert (code, out, err) == (2, "", "kvforensics: error: {}\n".format(line))


def test_an_impossible_port_in_a_hosts_file_is_a_usage_error(tmp_path):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("gpu-01\nroot@gpu-02:123456  # typo\n")
    code, out, err = run_cli(["inspect", "--hosts-file", str(hosts)])
    assert (code, err) == (2, "kvforensics: error: root@gpu-02:123456: port '123456' is not 1–65535\n")


@pytest.mark.parametrize("value", ["0", "-1", "86401", "nan", "inf"])
def test_timeout_says_the_range_it_accepts(value):
    code, out, err = run_cli(["inspect", "--from", SEED_NODE, "--timeout", value])
    shown = "{:g}".format(float(value))
    assert (code, err) == (2, "kvforensics: error: --timeout must be more than 0 and at most 86400 seconds, "
                              "not {}\n".format(shown))


@pytest.mark.parametrize("value", ["0.5", "86400"])
def test_timeout_inside_the_range_is_taken(value):
    code, out, err = run_cli(["inspect", "--from", SEED_NODE, "--timeout", value, "--format", "oneline"])
    assert code == 1 and err == ""


def test_parallel_out_of_range_is_said_alone():
    code, out, err = run_cli(["inspect", "--from", SEED_NODE, "--parallel", "0"])
    assert (code, err) == (2, "kvforensics: error: --parallel must be 1–1024, not 0\n")


def test_bare_command_prints_the_help_plainly():
    code, out, err = run_cli([])
    assert code == 2 and err == ""
    assert out.startswith("Usage: kvforensics [OPTIONS] COMMAND [ARGS]...\n")
    assert out == run_cli(["--help"])[1]  # the help itself, no "error:" before it
    proc = subprocess.run([sys.executable, "-m", "kvforensics"], cwd=str(ROOT), capture_output=True, text=True,
                          timeout=60)
    assert (proc.returncode, proc.stderr) == (2, "") and proc.stdout == out


def test_ipv6_targets_stay_bracketed():
    """[::1]:PORT is OpenSSH's IPv6 form, not a pdsh range of one host named '::1'."""
    from kvforensics.agent.remote.targets import expand_targets

    typed = ["root@[::1]:2222", "[fe80::1%eth0]:22", "[::1]", "gpu-[1-2]"]
    assert expand_targets(typed) == ["root@[::1]:2222", "[fe80::1%eth0]:22", "[::1]", "gpu-1", "gpu-2"]


def test_an_ipv6_host_is_shown_with_its_port_bracketed():
    try:
        held = socket.socket(socket.AF_INET6)
        held.bind(("::1", 0))  # bound, never listening: refused, and no other process can take it meanwhile
    except OSError:
        pytest.skip("no IPv6 loopback here")
    with held:
        port = held.getsockname()[1]
        target = "root@[::1]:{}".format(port)
        code, out, err = run_cli(["inspect", target, "--format", "oneline", "--timeout", "20"])
        assert code == 3 and out.splitlines()[1].split("\t") == [
            target, "unreachable", "—", "—", "—", "—", "—", "—", "[::1]:{}: Connection refused".format(port)]
        code, out, err = run_cli(["inspect", target, "--timeout", "20"])
    assert (code, out, err) == (3, "", "kvforensics: {}: unreachable: [::1]:{}: Connection refused\n".format(
        target, port))


def test_analyze_oneline_is_one_line_under_inspects_header():
    code, out, err = run_cli(["analyze", str(SEED_LOG), "--format", "oneline"])
    inspect_header = run_cli(["inspect", "--from", SEED_NODE, "--format", "oneline"])[1].splitlines()[0]
    assert code == 1 and err == ""
    assert out.splitlines() == [inspect_header, "\t".join([
        str(SEED_LOG), "ok", "8", "SGLang 0.5.6–0.5.8", "Kimi-K2.5-INT4", "159277", "3.31", "warning",
        "The draft model (LlamaForCausalLMEagle3) took 3.52 GiB out of the reserve"])]


def test_analyze_oneline_of_a_vllm_log():
    log = str(ROOT / "examples" / "vllm-v0-complete.log")
    code, out, err = run_cli(["analyze", log, "--format", "oneline", "--fail-on", "never"])
    assert code == 0 and out.splitlines()[1] == "\t".join([
        log, "ok", "1", "vLLM V0 0.7.3–0.10.2", "—", "—", "13.20", "warning",
        "13.20 GiB of GPU memory sits unused on every GPU after startup"])


@pytest.fixture
def probe_answer(tmp_path):
    """What a reviewer gets running `kvforensics probe -o` by hand on a (fake) node, login noise included."""
    build_fake_nvml()
    script = tmp_path / "probe.py"
    assert run_cli(["probe", "-o", str(script)])[0] == 0
    with FakeNode(tmp_path / "node") as node:
        env = dict(os.environ, FAKE_NVML_SCENARIO=str(node.scenario), LD_LIBRARY_PATH=str(FAKE_LIB.parent))
        proc = subprocess.run([sys.executable, "-I", "-"], input=script.read_bytes(), capture_output=True, env=env,
                              timeout=120)
    assert proc.returncode == 0, proc.stderr
    answer = tmp_path / "answer.txt"
    answer.write_bytes(b"Welcome to gpu-07 \xa9 ACME\n" + proc.stdout + b"logout\n")  # a Latin-1 motd, even
    return answer


def test_from_reads_the_probes_own_answer(probe_answer):
    code, out, err = run_cli(["inspect", "--from", str(probe_answer), "--json", "--fail-on", "never"])
    (t,) = json.loads(out)["targets"]
    assert code == 0 and t["target"] == "bundle:{}".format(probe_answer)
    assert len(t["gpus"]) == 8 and t["gpus"][0]["name"].startswith("NVIDIA RTX PRO 6000")


@pytest.mark.parametrize("change, line", [
    (('"checksum":"', '"checksum":"0'), "the probe's snapshot failed its checksum"),
    (('"version":1', '"version":9'), "the probe answered protocol version 9, expected 1"),
    (('"code_sha256":"', '"code_sha256":"f'), "the probe that printed this is not the one this kvforensics ships "
                                               "(another version?): run the one `kvforensics probe -o FILE` writes"),
])
def test_from_verifies_the_probes_answer_as_over_ssh(probe_answer, change, line):
    raw = probe_answer.read_bytes()
    old, new = change[0].encode(), change[1].encode()
    assert old in raw
    probe_answer.write_bytes(raw.replace(old, new, 1))
    code, out, err = run_cli(["inspect", "--from", str(probe_answer)])
    assert (code, out, err) == (2, "", "kvforensics: error: {}: {}\n".format(probe_answer, line))


def test_analyze_on_a_bundle_names_it_and_where_it_belongs():
    """A bundle given to analyze: said for what it is, not "no SGLang startup lines found"."""
    code, out, err = run_cli(["analyze", SEED_NODE])
    assert code == 2 and err.count("\n") == 1
    assert "kvforensics' own JSON (an evidence bundle or a probe's answer)" in err
    assert "kvforensics inspect --from {}".format(SEED_NODE) in err
