"""kvforensics inspect over SSH against real OpenSSH servers on 127.0.0.1 (no mocks of SSH)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.fakenode import FAKE_LIB, GIB, TOTAL, FakeNode, FakeVllmNode, build_fake_nvml
from tests.sshd import SSHD, USER, Sshd, client_config, host_options, keygen

if SSHD is None:
    if os.environ.get("CI"):
        raise RuntimeError("sshd is missing: .ci/run must install openssh-server")
    pytest.skip("sshd not installed (CI installs openssh-server)", allow_module_level=True)


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    return {"client": keygen(d / "client"), "stranger": keygen(d / "stranger")}


@pytest.fixture(scope="module")
def server(tmp_path_factory, keys):
    s = Sshd(tmp_path_factory.mktemp("sshd"), [keys["client"]])
    yield s
    s.stop()


@pytest.fixture(scope="module")
def jump(tmp_path_factory, keys):
    s = Sshd(tmp_path_factory.mktemp("sshd-jump"), [keys["client"]])
    yield s
    s.stop()


@pytest.fixture(scope="module")
def no_python(tmp_path_factory, keys):
    s = Sshd(tmp_path_factory.mktemp("sshd-nopy"), [keys["client"]],
             extra='ForceCommand env PATH=/nonexistent /bin/sh -c "$SSH_ORIGINAL_COMMAND"')
    yield s
    s.stop()


@pytest.fixture(autouse=True)
def no_agent(monkeypatch):
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)


@pytest.fixture
def env(tmp_path, server, jump, no_python, keys):
    known = tmp_path / "known_hosts"
    known.write_text(server.known_hosts_line() + jump.known_hosts_line() + no_python.known_hosts_line())
    cfg = client_config(tmp_path / "ssh_config", {
        "node": host_options(server, keys["client"], known),
        "node2": host_options(server, keys["client"], known),
        "viajump": host_options(server, keys["client"], known, ProxyJump="jumphost"),
        "jumphost": host_options(jump, keys["client"], known),
        "wrongkey": host_options(server, keys["stranger"], known),
        "nopython": host_options(no_python, keys["client"], known),
        "strangerhost": host_options(server, keys["client"], tmp_path / "empty_known_hosts"),
        "acceptnew": host_options(server, keys["client"], tmp_path / "new_known_hosts",
                                  StrictHostKeyChecking="accept-new"),
        "changedkey": host_options(server, keys["client"], tmp_path / "changed_known_hosts"),
    })
    # changedkey's own known_hosts records another key for the server (the stranger's), so "node" stays good
    kind, b64 = Path(str(keys["stranger"]) + ".pub").read_text().split()[0:2]
    (tmp_path / "changed_known_hosts").write_text("[127.0.0.1]:{} {} {}\n".format(server.port, kind, b64))
    return {"config": cfg, "known": known, "dir": tmp_path}


def _run(env, *argv, expect=None):
    code, out, err = run_cli(["inspect", "--ssh-config", str(env["config"]), "--timeout", "60", "--json",
                              "--no-http", *argv])
    doc = json.loads(out)
    if expect is not None:
        assert code == expect, err
    return code, doc["targets"], err


@pytest.fixture
def remote_lib(tmp_path, fake_node):
    """A copy of the fake driver with the node's scenario beside it: what sshd's probe loads."""
    folder = tmp_path / "driver"
    folder.mkdir()
    shutil.copy(str(FAKE_LIB), str(folder / "libnvidia-ml.so.1"))
    shutil.copy(str(fake_node.scenario), str(folder / "scenario.txt"))
    os.chmod(folder, 0o755)
    return folder / "libnvidia-ml.so.1"


@pytest.fixture
def fake_node(tmp_path):
    build_fake_nvml()
    with FakeNode(tmp_path / "node", foreign={3: 2 * GIB}) as node:
        yield node


def test_seed_node_end_to_end_over_ssh(env, remote_lib, fake_node):
    code, targets, err = _run(env, "node", "--nvml-lib", str(remote_lib), expect=1)
    (t,) = targets
    assert t["target"] == "ssh:node" and t["status"] == "ok"
    assert len(t["gpus"]) == 8 and all(g["total_bytes"] == TOTAL for g in t["gpus"])
    assert [g["rank"] for g in t["gpus"]] == ["TP{}".format(i) for i in range(8)]
    codes = {f["code"] for f in t["findings"]}
    assert {"unused_gpu_memory", "foreign_gpu_process", "mem_fraction_semantics", "draft_in_reserve"} <= codes
    assert t["startup"]["budget"]["predicted_tokens"] == 159294
    assert "sk-do-not-print" not in json.dumps(t)
    rec = next(r for r in t["recommendations"] if r["flag"] == "--mem-fraction-static")
    assert rec["basis"] == "estimated"  # one look at NVML over SSH: no recorded history there


def test_a_vllm_node_over_ssh(env, tmp_path):
    """The probe carries vLLM's discovery too: a TP=2 vLLM node read over real sshd is placed and sized
    as on the node itself (tests/test_inspect_vllm.py)."""
    build_fake_nvml()
    with FakeVllmNode(tmp_path / "vllm", tp=2, foreign={1: 2 * GIB}) as node:
        folder = tmp_path / "vdriver"
        folder.mkdir()
        shutil.copy(str(FAKE_LIB), str(folder / "libnvidia-ml.so.1"))
        shutil.copy(str(node.scenario), str(folder / "scenario.txt"))
        os.chmod(folder, 0o755)
        code, (t,), err = _run(env, "node", "--nvml-lib", str(folder / "libnvidia-ml.so.1"), expect=1)
        pids = dict(node.pids)
    assert t["status"] == "ok" and t["engine"]["name"] == "vllm"
    assert [g["rank"] for g in t["gpus"]] == ["Worker_TP0", "Worker_TP1"]
    assert [p["pid"] for p in t["gpus"][0]["processes"]] == [pids["tp0"]]
    assert {"unused_gpu_memory", "foreign_gpu_process", "gpu_memory_utilization_semantics"} <= {
        f["code"] for f in t["findings"]}
    assert "sk-do-not-print" not in json.dumps(t)


def test_engine_chooses_over_ssh_too(env, tmp_path):
    """--engine travels to the probe as text and is parsed there: a port names the vLLM node's server, a pod
    names nothing on a node without pods, and the report says which servers the node runs."""
    build_fake_nvml()
    with FakeVllmNode(tmp_path / "vllm", tp=2) as node:
        folder = tmp_path / "vdriver"
        folder.mkdir()
        shutil.copy(str(FAKE_LIB), str(folder / "libnvidia-ml.so.1"))
        shutil.copy(str(node.scenario), str(folder / "scenario.txt"))
        os.chmod(folder, 0o755)
        lib = str(folder / "libnvidia-ml.so.1")
        _, (chosen,), _ = _run(env, "node", "--nvml-lib", lib, "--engine", str(node.port), expect=1)
        _, (none,), _ = _run(env, "node", "--nvml-lib", lib, "--engine", "team-a/llama-0:{}".format(node.port),
                             expect=1)
    assert chosen["status"] == "ok" and chosen["engine"]["name"] == "vllm"
    assert [g["rank"] for g in chosen["gpus"]] == ["Worker_TP0", "Worker_TP1"]
    missing = next(f for f in none["findings"] if f["code"] == "engine_not_found")
    assert missing["title"] == "No server in the pod asked for (--engine)"
    assert "no inference server in pod team-a/llama-0 on port {}".format(node.port) in missing["detail"]


def test_same_report_as_on_the_node(env, remote_lib, fake_node, monkeypatch):
    _, (remote,), _ = _run(env, "node", "--nvml-lib", str(remote_lib))
    monkeypatch.setenv("FAKE_NVML_SCENARIO", str(fake_node.scenario))
    code, out, err = run_cli(["inspect", "--json", "--no-http", "--nvml-lib", str(remote_lib)])
    (local,) = json.loads(out)["targets"]
    # Host RAM moves between two live looks, and other SGLang servers on this machine (a second
    # copy of the suite) come and go; everything else must be identical.
    def steady(items, key):
        return [x for x in items if not (x[key].startswith(("host_ram", "other_engines"))
                                         or x[key].startswith("--enable-hierarchical"))]

    assert remote["gpus"] == local["gpus"]
    assert steady(remote["findings"], "code") == steady(local["findings"], "code")
    assert steady(remote["recommendations"], "flag") == steady(local["recommendations"], "flag")
    assert [f["code"] for f in steady(remote["findings"], "code")] == [f["code"] for f in steady(local["findings"],
                                                                                                 "code")]


@pytest.mark.parametrize("transport", ["openssh", "paramiko"])
def test_unknown_host_key_refused_then_accepted_and_remembered(env, transport):
    code, (t,), err = _run(env, "--transport", transport, "strangerhost", expect=3)
    assert t["status"] == "host_key_refused"
    msg = t["problems"][0]["message"]
    assert "not a known host" in msg and "SHA256:" in msg and "--accept-new-host-keys" in msg
    assert not (env["dir"] / "empty_known_hosts").exists()
    code, (t,), err = _run(env, "--transport", transport, "strangerhost", "--accept-new-host-keys")
    assert t["status"] in ("ok", "partial") and "recorded new host key" in err
    text = (env["dir"] / "empty_known_hosts").read_text()
    assert text.count("\n") == 1 and text.startswith("[127.0.0.1]:")
    assert not any(p.name.endswith(".lock") for p in env["dir"].iterdir())  # no lock file left behind
    code, (t,), err = _run(env, "--transport", transport, "strangerhost")  # remembered: no flag needed now
    assert t["status"] in ("ok", "partial") and "recorded" not in err


@pytest.mark.parametrize("transport", ["openssh", "paramiko"])
def test_accept_new_from_ssh_config(env, transport):
    code, (t,), err = _run(env, "--transport", transport, "acceptnew")
    assert t["status"] in ("ok", "partial")
    assert (env["dir"] / "new_known_hosts").exists()


@pytest.mark.parametrize("transport", ["openssh", "paramiko"])
def test_changed_host_key_is_always_refused(env, server, tmp_path, transport):
    other = keygen(tmp_path / "impostor")
    kind, b64 = Path(str(other) + ".pub").read_text().split()[0:2]
    env["known"].write_text("[127.0.0.1]:{} {} {}\n".format(server.port, kind, b64))
    for extra in ((), ("--accept-new-host-keys",)):
        code, (t,), err = _run(env, "--transport", transport, "node", *extra, expect=3)
        assert t["status"] == "host_key_refused"
        assert "CHANGED" in t["problems"][0]["message"] and "man-in-the-middle" in t["problems"][0]["message"]
        # the advice edits the file that holds the key (this config's UserKnownHostsFile), not ~/.ssh/known_hosts
        assert "ssh-keygen -f '{}' -R".format(env["known"]) in t["problems"][0]["message"]
    assert env["known"].read_text().count("\n") == 1  # nothing was recorded


@pytest.mark.parametrize("transport", ["openssh", "paramiko"])
def test_proxy_jump(env, transport):
    code, (t,), err = _run(env, "--transport", transport, "viajump")
    assert t["status"] in ("ok", "partial") and t["target"] == "ssh:viajump"


@pytest.mark.parametrize("transport", ["openssh", "paramiko"])
def test_wrong_key_is_auth_failed(env, transport):
    code, (t,), err = _run(env, "--transport", transport, "wrongkey", expect=3)
    msg = t["problems"][0]["message"]
    assert t["status"] == "auth_failed" and "no key was accepted" in msg
    assert "SHA256:" in msg and "--identity FILE" in msg  # which keys were tried, and how to choose


@pytest.mark.parametrize("transport", ["openssh", "paramiko"])
def test_connection_refused(env, tmp_path, transport):
    from tests.sshd import free_port

    port = free_port()
    code, (t,), err = _run(env, "--transport", transport, "{}@127.0.0.1:{}".format(USER, port), expect=3)
    assert t["status"] == "unreachable" and "refused" in t["problems"][0]["message"].lower()


@pytest.mark.parametrize("transport", ["openssh", "paramiko"])
def test_silent_port_honours_the_deadline_and_spares_other_hosts(env, transport):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    held = []
    stop = threading.Event()

    def accept():
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])  # accept TCP, never say a word
            except OSError:
                continue

    threading.Thread(target=accept, daemon=True).start()
    try:
        start = time.monotonic()
        code, out, err = run_cli(["inspect", "--ssh-config", str(env["config"]), "--timeout", "3", "--json",
                                  "--no-http", "--transport", transport,
                                  "{}@127.0.0.1:{}".format(USER, listener.getsockname()[1]), "node"])
        took = time.monotonic() - start
    finally:
        stop.set()
        listener.close()
    targets = json.loads(out)["targets"]
    statuses = {t["target"]: t["status"] for t in targets}
    assert statuses["ssh:node"] in ("ok", "partial")
    silent = [t for t in targets if t["target"] != "ssh:node"][0]
    assert silent["status"] == "unreachable"
    # the same words on either transport: the port answers TCP, and no SSH comes
    assert "no SSH handshake within" in silent["problems"][0]["message"]
    assert "does not speak SSH" in silent["problems"][0]["message"]
    assert code == 3 and took < 20  # the 3 s deadline, not a hang


@pytest.mark.parametrize("transport", ["openssh", "paramiko"])
def test_remote_without_python3(env, transport):
    code, (t,), err = _run(env, "nopython", "--transport", transport, expect=3)
    assert t["status"] == "error" and "no python3" in t["problems"][0]["message"]


@pytest.mark.parametrize("value", ["/tmp/kvf-x;touch /tmp/kvf-owned-1", "$(touch /tmp/kvf-owned-2)",
                                   "`touch /tmp/kvf-owned-3`"])
def test_hostile_log_paths_are_data(env, value):
    code, (t,), err = _run(env, "node", "--log", value)
    assert t["status"] in ("ok", "partial")
    assert not any(Path("/tmp/kvf-owned-{}".format(i)).exists() for i in (1, 2, 3))
    assert any(p["code"].startswith("engine_log.") and "no such file" in p["message"] for p in t["problems"])


def test_hostile_journal_unit_is_refused_before_connecting(env, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["inspect", "--ssh-config", str(env["config"]), "node", "--log", "journal:x;touch owned"])
    assert code == 2 and not (tmp_path / "owned").exists()


def test_nothing_left_on_the_remote(env, server):
    """The session's TMPDIR is its own (tests/sshd.py), so other processes on this machine
    cannot disturb the comparison; in the login directory, no module or bytecode files."""
    home = os.path.expanduser("~")
    before = set(os.listdir(str(server.tmpdir)))
    code, (t,), err = _run(env, "node")
    assert t["status"] in ("ok", "partial")
    assert set(os.listdir(str(server.tmpdir))) == before == set()
    assert not {"__pycache__", "collectors", "pynvml.py", "probe.py"} & set(os.listdir(home))


def test_one_host_over_ssh_is_one_screen_and_a_fleet_one_line_per_host(env, remote_lib, fake_node, monkeypatch):
    """inspect HOST prints the node's answer on one screen (the full report with --detail); several
    hosts print one line each, and each host's full report after them only with --detail."""
    monkeypatch.setenv("COLUMNS", "80")
    base = ["inspect", "--ssh-config", str(env["config"]), "--timeout", "60", "--no-http", "--no-color",
            "--nvml-lib", str(remote_lib)]
    code, short, err = run_cli(base + ["node"])
    lines = short.splitlines()
    assert code == 1 and lines[0].startswith("kvforensics ssh:node") and len(lines) <= 40, short
    assert "GPUs now" in short and "add --detail" in lines[-1] and "Where each GPU's memory is now" not in short
    code, full, err = run_cli(base + ["node", "-v"])
    assert "Where each GPU's memory is now" in full and "Memory ledger per rank" in full
    code, fleet, err = run_cli(base + ["node", "node2"])
    assert "2 host(s), 2 collected" in fleet and "kvforensics ssh:node" not in fleet
    assert len([x for x in fleet.splitlines() if x.startswith(("node ", "node2 "))]) == 2
    code, both, err = run_cli(base + ["node", "node2", "--detail"])
    assert both.count("Memory ledger per rank") == 2 and both.index("2 host(s)") < both.index("kvforensics ssh:node")


def test_fleet_summary_and_hosts_file(env, tmp_path):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("# the fleet\nnode\nwrongkey\n\nnode2  # same box\n")
    code, out, err = run_cli(["inspect", "--ssh-config", str(env["config"]), "--hosts-file", str(hosts), "--no-http",
                              "--no-color", "--parallel", "3"])
    assert code == 3
    assert "3 host(s), 2 collected" in out
    for host in ("node", "node2", "wrongkey"):
        assert host in out
    assert "auth_failed" in out
    # the table may cut a failure's message to the width: the whole of it is one line on stderr
    assert [line for line in err.splitlines() if "auth_failed" in line] == [
        line for line in err.splitlines() if line.startswith("kvforensics: wrongkey: auth_failed: ")]
    assert err.count("auth_failed") == 1
    code, out, err = run_cli(["inspect", "--ssh-config", str(env["config"]), "--hosts-file", str(hosts), "--no-http",
                              "--json"])
    doc = json.loads(out)
    assert [t["target"] for t in doc["targets"]] == ["ssh:node", "ssh:wrongkey", "ssh:node2"]  # as given
    assert [t["status"] for t in doc["targets"]][1] == "auth_failed"


def test_each_host_is_schema_checked_once_and_analysed_once(env, monkeypatch):
    """A fleet's client pays per host: the probe's answer is checked against the snapshot schema where it
    arrives (parse_answer), then typed without a second walk; each snapshot is analysed once, as it arrives."""
    from kvforensics.agent.model import evidence, reconcile

    checked, analysed = [], []
    real_check, real_inspect = evidence.check, reconcile.inspect_snapshot

    def counting_check(name, document):
        if name == "snapshot":
            checked.append(document.get("hostname"))
        return real_check(name, document)

    def counting_inspect(snap, target, *args, **kwargs):
        analysed.append(target)
        return real_inspect(snap, target, *args, **kwargs)

    monkeypatch.setattr(evidence, "check", counting_check)
    monkeypatch.setattr(reconcile, "inspect_snapshot", counting_inspect)
    code, targets, err = _run(env, "node", "node2", "--parallel", "2")
    assert len(targets) == 2 and all(t["status"] in ("ok", "partial") for t in targets), err
    assert len(checked) == 2 and sorted(analysed) == ["ssh:node", "ssh:node2"]
    # a snapshot from anywhere else (a plain dict) is still checked when typed
    with pytest.raises(evidence.EvidenceError):
        evidence.parse({"schema": "kvforensics.snapshot/1", "nvml": {"status": "ok", "gpus": [{"total_bytes": "x"}]}})


def test_probe_is_one_round_trip_and_reproducible():
    from kvforensics.agent.remote import probe

    a, b = probe.build({"http": False}), probe.build({"http": False})
    assert a.script == b.script and a.code_sha256 == b.code_sha256
    assert probe.REMOTE_COMMAND == "python3 -I -"


def test_probe_answer_checks():
    from kvforensics.agent.remote import probe
    from kvforensics.collectors.probe import MARKER, canonical

    p = probe.build({})
    snap = {"schema": "kvforensics.snapshot/1", "x": 1, "nvml": {"status": "absent"}, "host_memory": {},
            "engines": {"engines": []}}
    import hashlib

    def signed(snapshot):
        return {"version": 1, "code_sha256": p.code_sha256, "snapshot": snapshot,
                "checksum": hashlib.sha256(canonical(snapshot).encode()).hexdigest()}

    good = signed(snap)
    noisy = b"Welcome to gpu-07\nLast login: today\n" + (MARKER + canonical(good)).encode() + b"\nbye\n"
    assert probe.parse_answer(noisy, p) == snap
    for change, code in (({"checksum": "0" * 64}, "probe.checksum"), ({"version": 99}, "probe.version"),
                         ({"code_sha256": "f" * 64}, "probe.code_mismatch")):
        bad = dict(good, **change)
        with pytest.raises(probe.ProbeError) as exc:
            probe.parse_answer((MARKER + canonical(bad)).encode(), p)
        assert exc.value.code == code
    with pytest.raises(probe.ProbeError) as exc:
        probe.parse_answer(b"bash: line 1: oops\n", p)
    assert exc.value.code == "probe.no_answer"
    # A lying host can run the probe and re-sign a forged snapshot: the checksum holds, the schema does not.
    forged = dict(snap, nvml={"status": "ok", "gpus": [{"index": 0, "total_bytes": "lots"}]})
    with pytest.raises(probe.ProbeError) as exc:
        probe.parse_answer((MARKER + canonical(signed(forged))).encode(), p)
    assert exc.value.code == "probe.invalid_answer" and "nvml/gpus/0/total_bytes" in exc.value.message


@pytest.mark.parametrize("transport", ["openssh", "paramiko"])
def test_encrypted_key_is_never_prompted_for_in_batch_use(tmp_path, keys, transport):
    """The server accepts the key, whose private half is locked: no prompt outside a terminal, one clear line."""
    import subprocess

    locked = tmp_path / "locked"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "s3cret", "-f", str(locked)], check=True)
    server = Sshd(tmp_path / "sshd", [keys["client"], locked])
    try:
        known = tmp_path / "known"
        known.write_text(server.known_hosts_line())
        cfg = client_config(tmp_path / "cfg_locked", {"locked": host_options(server, locked, known)})
        code, out, err = run_cli(["inspect", "--ssh-config", str(cfg), "--json", "--no-http", "--timeout", "10",
                                  "--transport", transport, "locked"])
    finally:
        server.stop()
    (t,) = json.loads(out)["targets"]
    assert t["status"] == "auth_failed"
    assert "needs a passphrase and this is not a terminal" in t["problems"][0]["message"]


def test_probe_as_a_non_root_user_reports_what_it_cannot_see(tmp_path, fake_node):
    """An unprivileged user sees the root-owned engine's command line but not its stdout."""
    import subprocess
    import tempfile

    from kvforensics.agent.remote import probe

    if os.geteuid() != 0 or not os.path.exists("/usr/bin/python3"):
        pytest.skip("needs root to start a probe as another user, and /usr/bin/python3")
    import pwd

    nobody = pwd.getpwnam("nobody")
    folder = tempfile.mkdtemp(prefix="kvf-nobody-")
    try:
        os.chmod(folder, 0o755)
        shutil.copy(str(FAKE_LIB), os.path.join(folder, "libnvidia-ml.so.1"))
        shutil.copy(str(fake_node.scenario), os.path.join(folder, "scenario.txt"))
        for name in os.listdir(folder):
            os.chmod(os.path.join(folder, name), 0o755)
        p = probe.build({"nvml_lib": os.path.join(folder, "libnvidia-ml.so.1"), "http": False})
        env = {k: v for k, v in os.environ.items() if k != "FAKE_NVML_SCENARIO"}  # use the scenario beside the copy
        proc = subprocess.run(["/usr/bin/python3", "-I", "-"], input=p.script, capture_output=True, timeout=60,
                              cwd=folder,
                              env=env, preexec_fn=lambda: (os.setgid(nobody.pw_gid), os.setuid(nobody.pw_uid)))
        snap = probe.parse_answer(proc.stdout, p)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    assert len(snap["nvml"]["gpus"]) == 8
    # Select by PID: another fake node (a second copy of the suite) may be running too.
    assert any(e["server"] and e["server"]["pid"] == fake_node.server_pid for e in snap["engines"]["engines"])
    problem = snap["engine_log"]["problems"][0]["message"]
    assert "not readable: run as its user or root" in problem
    from kvforensics.agent.model.reconcile import inspect_snapshot
    from kvforensics.agent.model.records import Options

    insp = inspect_snapshot(snap, "ssh:test", Options())
    assert any(f.code == "engine_log_missing" for f in insp.findings)
    assert all(g.rank is not None for g in insp.gpus)  # GPUs still mapped to ranks from the process table


def test_keys_from_a_real_ssh_agent(env, server, keys, tmp_path, monkeypatch):
    import subprocess

    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    try:
        deadline = time.time() + 10
        while not sock.exists() and time.time() < deadline:
            time.sleep(0.05)
        subprocess.run(["ssh-add", "-q", str(keys["client"])], env=dict(os.environ, SSH_AUTH_SOCK=str(sock)),
                       check=True)
        monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
        monkeypatch.setenv("HOME", str(tmp_path))  # no default identities to fall back on
        cfg = client_config(tmp_path / "cfg_agent", {"viaagent": {
            "HostName": "127.0.0.1", "Port": server.port, "User": USER, "UserKnownHostsFile": env["known"]}})
        code, out, err = run_cli(["inspect", "--ssh-config", str(cfg), "--json", "--no-http", "viaagent"])
        (t,) = json.loads(out)["targets"]
        assert t["status"] in ("ok", "partial"), t["problems"]
    finally:
        agent.kill()
        agent.wait()


def test_probe_answer_without_a_snapshot_is_refused():
    import hashlib

    from kvforensics.agent.remote import probe
    from kvforensics.collectors.probe import MARKER, canonical

    p = probe.build({})
    for snap in (None, [], {"schema": "something else"}):
        answer = {"version": 1, "code_sha256": p.code_sha256, "snapshot": snap,
                  "checksum": hashlib.sha256(canonical(snap).encode()).hexdigest()}
        with pytest.raises(probe.ProbeError) as exc:
            probe.parse_answer((MARKER + canonical(answer)).encode(), p)
        assert exc.value.code == "probe.invalid_answer"


@pytest.mark.parametrize("target", ["node:99999", "node:0", "[::1]:70000", "host:abc"])
def test_impossible_ports_are_refused(target):
    from kvforensics.agent.remote import ssh

    with pytest.raises(ssh.SshError) as exc:
        ssh.resolve(target, ssh.load_config(None))
    assert "is not 1–65535" in exc.value.message


def test_match_exec_is_refused_before_anything_runs_on_paramiko(tmp_path, monkeypatch):
    """paramiko would run the stanza's command while merely looking a host up: that transport refuses the file
    (OpenSSH, the default, runs it as `ssh` does: test_openssh.py)."""
    monkeypatch.chdir(tmp_path)
    cfg = tmp_path / "cfg"
    cfg.write_text('Host *\n  User root\nMatch exec "touch {}"\n  User x\n'.format(tmp_path / "ran"))
    code, out, err = run_cli(["inspect", "--transport", "paramiko", "--ssh-config", str(cfg), "somehost"])
    assert code == 2 and "Match exec" in err and not (tmp_path / "ran").exists()


def test_proxycommand_is_refused_with_the_alternative(tmp_path):
    from kvforensics.agent.remote import ssh

    cfg = tmp_path / "cfg"
    cfg.write_text("Host gw\n  ProxyCommand nc %h %p\n")
    with pytest.raises(ssh.SshError) as exc:
        ssh.resolve("gw", ssh.load_config(str(cfg)))
    assert "ProxyJump" in exc.value.message


def test_a_host_that_floods_stdout_is_cut_off_on_paramiko(env, tmp_path):
    """A remote python3 that prints without end: the client stops at the cap, on time, with a bounded
    buffer (this host's 'python3' is a stand-in that floods)."""
    from kvforensics.agent.remote import ssh

    old = ssh.MAX_STDOUT_BYTES
    ssh.MAX_STDOUT_BYTES = 1 << 20
    try:
        spec = ssh.resolve("node", ssh.load_config(str(env["config"])))
        session = ssh.connect(spec, ssh.load_config(str(env["config"])), time.monotonic() + 20)
        try:
            with pytest.raises(ssh.SshError) as exc:
                ssh.exec_once(session, "yes kvforensics-flood", b"", time.monotonic() + 20)
        finally:
            session.close()
    finally:
        ssh.MAX_STDOUT_BYTES = old
    assert "more than 1 MiB" in exc.value.message


# --- every failure is said (On call) ------------------------------------------------------------------

def _fingerprint(pub: Path) -> str:
    import base64
    import hashlib

    blob = base64.b64decode(pub.read_text().split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


@pytest.fixture
def closed_ports():
    """Ports bound here and never listened on, held for the whole test: a connection is refused, and no
    server (another copy of the suite's sshd) can take them meanwhile."""
    held = []

    def take() -> int:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        held.append(s)
        return s.getsockname()[1]

    yield take
    for s in held:
        s.close()


def _failure(kind, env, server, keys, closed_ports):
    """(target as typed, status, the whole one-line message) of each kind of failed host."""
    name = "[127.0.0.1]:{}".format(server.port)
    if kind == "closed port":
        port = closed_ports()
        return "{}@127.0.0.1:{}".format(USER, port), "unreachable", "[127.0.0.1]:{}: Connection refused".format(port)
    if kind == "unknown host key":
        return "strangerhost", "host_key_refused", (
            "{} is not a known host (ssh-ed25519 key {}). Check the fingerprint, then accept it with "
            "--accept-new-host-keys (or StrictHostKeyChecking accept-new)").format(
                name, _fingerprint(Path(str(server.host_key) + ".pub")))
    if kind == "changed host key":
        return "changedkey", "host_key_refused", (
            "WARNING: the host key of {} has CHANGED (now ssh-ed25519 {}). Someone may be intercepting the "
            "connection (man-in-the-middle), or the host was reinstalled. Refused whatever the options; if the "
            "change is expected, remove the old key: ssh-keygen -f '{}' -R '{}'").format(
                name, _fingerprint(Path(str(server.host_key) + ".pub")), env["dir"] / "changed_known_hosts", name)
    assert kind == "wrong key"
    return "wrongkey", "auth_failed", (
        "{}@{}: no key was accepted (tried {} {}). Choose the user with user@host or User, the key with "
        "--identity FILE or IdentityFile in the ssh config").format(
            USER, name, keys["stranger"], _fingerprint(Path(str(keys["stranger"]) + ".pub")))


FAILURE_KINDS = ("closed port", "unknown host key", "changed host key", "wrong key")


@pytest.mark.parametrize("transport", ["openssh", "paramiko"])
@pytest.mark.parametrize("several", [False, True], ids=["one target", "several targets"])
@pytest.mark.parametrize("fmt", ["terminal", "markdown", "oneline", "json"])
@pytest.mark.parametrize("kind", FAILURE_KINDS)
def test_every_failed_target_is_said_in_one_line(env, server, keys, closed_ports, kind, fmt, several, transport):
    """One failed host alone used to print nothing at all (exit 3) in terminal and markdown output. Now each
    failed target is one line: on stderr beside a report, in the row (oneline) or the document (JSON)."""
    failures = [_failure(kind, env, server, keys, closed_ports)]
    if several:
        failures.append(_failure("closed port", env, server, keys, closed_ports))
    argv = ["inspect", "--ssh-config", str(env["config"]), "--timeout", "60", "--no-http", "--no-color", "--format",
            fmt, "--transport", transport] + [target for target, _, _ in failures]
    code, out, err = run_cli(argv)
    assert code == 3, err
    lines = ["kvforensics: {}: {}: {}".format(*f) for f in failures]
    if fmt in ("terminal", "markdown"):
        from kvforensics.reports.failures import failure_line

        # said once, on stderr, in 80 columns (the table gives the status only); the whole message with -v
        short = [failure_line(target, status, "ssh." + status, message) for target, status, message in failures]
        assert err.splitlines() == short and all(len(line) <= 80 for line in short), short
        assert not any(message in out for _, _, message in failures)
        assert run_cli(argv + ["-v"])[2].splitlines() == lines
        assert (out == "") is (not several)  # one target: no table; several: the table, and the lines above
    elif fmt == "oneline":
        assert err == ""
        rows = [row.split("\t") for row in out.splitlines()[1:]]
        assert [(r[0], r[1], r[-1]) for r in rows] == failures
    else:
        assert err == ""
        targets = json.loads(out)["targets"]
        assert [(t["target"], t["status"], t["problems"][0]["message"]) for t in targets] == [
            ("ssh:" + target, status, message) for target, status, message in failures]
