"""The OpenSSH transport (the default) against real sshd servers on 127.0.0.1: what `ssh HOST` honours works
(ProxyCommand, Match exec, multiplexing), and kvforensics' own guarantees hold on it (host keys through a proxy,
a config's StrictHostKeyChecking no never trusting a host silently, floods, the paramiko fallback)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.sshd import SSHD, USER, Sshd, client_config, control_folder, host_options, keygen, ssh_clients_naming

if SSHD is None:
    if os.environ.get("CI"):
        raise RuntimeError("sshd is missing: .ci/run must install openssh-server")
    pytest.skip("sshd not installed (CI installs openssh-server)", allow_module_level=True)

# A ProxyCommand as the GPU clouds' are (aws ssm start-session, gcloud start-iap-tunnel, tsh proxy ssh): a program
# that carries the SSH stream on its stdin and stdout; this one to 127.0.0.1, and it says it ran.
RELAY = textwrap.dedent('''
    import os, selectors, socket, sys
    open(sys.argv[3], "a").write("relayed %s:%s\\n" % (sys.argv[1], sys.argv[2]))
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
    sel = selectors.DefaultSelector()
    sel.register(0, selectors.EVENT_READ, "in")
    sel.register(s, selectors.EVENT_READ, "net")
    while True:
        for key, _ in sel.select():
            if key.data == "in":
                data = os.read(0, 65536)
                if not data:
                    s.shutdown(socket.SHUT_WR)
                    sel.unregister(0)
                    continue
                s.sendall(data)
            else:
                data = s.recv(65536)
                if not data:
                    sys.exit(0)
                os.write(1, data)
''')


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    return {"client": keygen(d / "client"), "stranger": keygen(d / "stranger")}


@pytest.fixture(scope="module")
def server(tmp_path_factory, keys):
    s = Sshd(tmp_path_factory.mktemp("sshd"), [keys["client"]])
    yield s
    s.stop()


@pytest.fixture(autouse=True)
def private_control_dir(monkeypatch):
    """Each test's master connections in a folder of its own."""
    with control_folder() as folder:
        monkeypatch.setenv("KVFORENSICS_SSH_CONTROL_DIR", str(folder))
        monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
        yield folder


def _collected(t):
    """Reached and probed: ok, or partial (no NVML on this machine)."""
    return t["status"] in ("ok", "partial")


def _inspect(cfg, *targets, extra=()):
    code, out, err = run_cli(["inspect", "--ssh-config", str(cfg), "--timeout", "60", "--json", "--no-http",
                              *extra, *targets])
    return code, {t["target"]: t for t in json.loads(out)["targets"]}, err


def test_a_proxycommand_a_match_exec_and_a_plain_alias_beside_them(server, keys, tmp_path):
    known = tmp_path / "known"
    known.write_text(server.known_hosts_line())
    relay, marks, matched = tmp_path / "relay.py", tmp_path / "relayed", tmp_path / "matched"
    relay.write_text(RELAY)
    cfg = tmp_path / "config"
    client_config(cfg, {"viaproxy": host_options(server, keys["client"], known, ProxyCommand="{} {} %h %p {}".format(
        sys.executable, relay, marks)), "plain": host_options(server, keys["client"], known)})
    # 1Password-style: a Match exec stanza that runs for every host (and here sets the User of one alias)
    with open(str(cfg), "a") as f:
        f.write('Match host matched exec "touch {}"\n  HostName 127.0.0.1\n  Port {}\n  User {}\n  IdentityFile {}\n'
                '  IdentitiesOnly yes\n  UserKnownHostsFile {}\n'.format(matched, server.port, USER, keys["client"],
                                                                       known))
    code, targets, err = _inspect(cfg, "viaproxy", "plain", "matched")
    assert all(_collected(targets["ssh:" + t]) for t in ("viaproxy", "plain", "matched")), err
    assert marks.read_text().startswith("relayed 127.0.0.1:{}".format(server.port))  # the proxy carried it
    assert matched.exists()  # ssh ran the Match exec command, as `ssh matched` would


def test_the_host_key_policy_holds_through_a_proxy(server, keys, tmp_path):
    relay = tmp_path / "relay.py"
    relay.write_text(RELAY)
    proxy = "{} {} %h %p {}".format(sys.executable, relay, tmp_path / "relayed")
    impostor = keygen(tmp_path / "impostor")
    kind, b64 = Path(str(impostor) + ".pub").read_text().split()[:2]
    (tmp_path / "changed").write_text("[127.0.0.1]:{} {} {}\n".format(server.port, kind, b64))
    cfg = client_config(tmp_path / "config", {
        "unknown": host_options(server, keys["client"], tmp_path / "empty", ProxyCommand=proxy),
        "changed": host_options(server, keys["client"], tmp_path / "changed", ProxyCommand=proxy)})
    code, targets, err = _inspect(cfg, "unknown", "changed")
    assert code == 3
    assert targets["ssh:unknown"]["status"] == targets["ssh:changed"]["status"] == "host_key_refused"
    assert "not a known host (ssh-ed25519 key SHA256:" in targets["ssh:unknown"]["problems"][0]["message"]
    assert not (tmp_path / "empty").exists()
    code, targets, err = _inspect(cfg, "changed", extra=("--accept-new-host-keys",))
    assert "CHANGED" in targets["ssh:changed"]["problems"][0]["message"]  # whatever the options
    code, targets, err = _inspect(cfg, "unknown", extra=("--accept-new-host-keys",))
    assert _collected(targets["ssh:unknown"]) and "recorded new host key for [127.0.0.1]:" in err


def test_a_config_that_says_strict_checking_no_still_refuses_a_changed_key(server, keys, tmp_path):
    """StrictHostKeyChecking no would let ssh connect past a changed key: kvforensics reads it (ssh -G) as
    accept-new: a new host is recorded and said, a changed key refused."""
    impostor = keygen(tmp_path / "impostor")
    kind, b64 = Path(str(impostor) + ".pub").read_text().split()[:2]
    (tmp_path / "changed").write_text("[127.0.0.1]:{} {} {}\n".format(server.port, kind, b64))
    cfg = client_config(tmp_path / "config", {
        "lax": host_options(server, keys["client"], tmp_path / "fresh", StrictHostKeyChecking="no"),
        "laxchanged": host_options(server, keys["client"], tmp_path / "changed", StrictHostKeyChecking="no")})
    code, targets, err = _inspect(cfg, "lax", "laxchanged")
    assert _collected(targets["ssh:lax"]) and "recorded new host key" in err
    assert targets["ssh:laxchanged"]["status"] == "host_key_refused"
    assert (tmp_path / "changed").read_text().count("\n") == 1


def test_a_second_look_reuses_the_master_connection(server, keys, tmp_path, private_control_dir):
    known = tmp_path / "known"
    known.write_text(server.known_hosts_line())
    cfg = client_config(tmp_path / "config", {"node": host_options(server, keys["client"], known)})
    code, targets, err = _inspect(cfg, "node")
    assert _collected(targets["ssh:node"]), err
    (sock,) = list(private_control_dir.iterdir())
    check = subprocess.run(["ssh", "-o", "ControlPath={}".format(sock), "-O", "check", "node"], capture_output=True,
                           text=True)
    assert check.returncode == 0 and "Master running" in check.stderr
    # The master is ours: the folder is private, and another alias of the host with other keys gets its own.
    assert private_control_dir.stat().st_mode & 0o077 == 0
    code, targets, err = _inspect(cfg, "node")
    assert _collected(targets["ssh:node"]) and list(private_control_dir.iterdir()) == [sock]


def test_no_multiplex_leaves_no_master(server, keys, tmp_path, private_control_dir):
    known = tmp_path / "known"
    known.write_text(server.known_hosts_line())
    cfg = client_config(tmp_path / "config", {"node": host_options(server, keys["client"], known)})
    code, targets, err = _inspect(cfg, "node", extra=("--no-multiplex",))
    assert _collected(targets["ssh:node"]) and list(private_control_dir.iterdir()) == []


def test_a_control_folder_others_can_write_is_not_used(server, keys, tmp_path, monkeypatch):
    shared = tempfile.mkdtemp(prefix="kvf-cm-")
    os.chmod(shared, 0o777)
    monkeypatch.setenv("KVFORENSICS_SSH_CONTROL_DIR", shared)
    known = tmp_path / "known"
    known.write_text(server.known_hosts_line())
    cfg = client_config(tmp_path / "config", {"node": host_options(server, keys["client"], known)})
    code, targets, err = _inspect(cfg, "node")
    assert _collected(targets["ssh:node"]) and os.listdir(shared) == []
    os.rmdir(shared)


def test_a_flood_is_cut_off_on_the_openssh_transport_too(keys, tmp_path, monkeypatch):
    from kvforensics.agent.remote import openssh

    monkeypatch.setattr(openssh, "MAX_STDOUT_BYTES", 1 << 20)
    flood = Sshd(tmp_path / "sshd", [keys["client"]], extra="ForceCommand yes kvforensics-flood")
    try:
        known = tmp_path / "known"
        known.write_text(flood.known_hosts_line())
        cfg = client_config(tmp_path / "config", {"flood": host_options(flood, keys["client"], known)})
        code, targets, err = _inspect(cfg, "flood")
    finally:
        flood.stop()
    t = targets["ssh:flood"]
    assert t["status"] == "error" and "more than 1 MiB" in t["problems"][0]["message"]


def test_identity_falls_back_to_the_default_keys_like_ssh_i(server, keys, tmp_path, monkeypatch):
    """-i KEY adds a key to try first; ssh still tries the others (the config's IdentityFile here)."""
    known = tmp_path / "known"
    known.write_text(server.known_hosts_line())
    cfg = client_config(tmp_path / "config", {"node": {"HostName": "127.0.0.1", "Port": server.port, "User": USER,
                                                       "IdentityFile": keys["client"], "UserKnownHostsFile": known}})
    code, targets, err = _inspect(cfg, "node", extra=("-i", str(keys["stranger"])))
    assert _collected(targets["ssh:node"]), err


@pytest.mark.parametrize("target", ["-oProxyCommand=touch /tmp/kvf-pwned", "a b", "node;id"])
def test_a_target_is_never_an_option_or_a_command(target, tmp_path):
    code, out, err = run_cli(["inspect", "--json", "--no-http", "--", target])
    t = json.loads(out)["targets"][0]
    assert t["status"] == "error" and not Path("/tmp/kvf-pwned").exists()


def test_without_an_openssh_client_paramiko_connects_and_says_so(server, keys, tmp_path, monkeypatch):
    from kvforensics.agent.remote import openssh

    known = tmp_path / "known"
    known.write_text(server.known_hosts_line())
    cfg = client_config(tmp_path / "config", {"node": host_options(server, keys["client"], known)})
    monkeypatch.setattr(openssh, "_FOUND", {"ssh": None})
    code, targets, err = _inspect(cfg, "node")
    assert _collected(targets["ssh:node"])
    assert err.count("connecting with paramiko") == 1


def test_a_jump_host_whose_config_trusts_any_key_is_refused(server, keys, tmp_path):
    """The command line's StrictHostKeyChecking does not reach a ProxyJump hop (ssh connects to it by its own
    config): a hop that says no would be trusted silently."""
    known = tmp_path / "known"
    known.write_text(server.known_hosts_line())
    cfg = client_config(tmp_path / "config", {
        "inside": host_options(server, keys["client"], known, ProxyJump="laxjump"),
        "laxjump": host_options(server, keys["client"], tmp_path / "other", StrictHostKeyChecking="no")})
    code, targets, err = _inspect(cfg, "inside")
    t = targets["ssh:inside"]
    assert t["status"] == "host_key_refused" and "ProxyJump hop laxjump" in t["problems"][0]["message"]
    assert not (tmp_path / "other").exists()  # nothing was contacted


@pytest.mark.parametrize("transport", ["openssh", "paramiko"])
@pytest.mark.parametrize("command,status,words", [
    ("echo KVF-PROBE '{\"version\": 1, \"snapshot\": {}}'", "error", "ran different code than was sent"),
    ("echo KVF-PROBE not-json", "error", "the probe's answer is unusable"),
    ("sleep 30", "unreachable", "no answer within 4 s (--timeout)"),
], ids=["forged answer", "garbled answer", "slow host"])
def test_a_lying_or_slow_host_costs_itself_alone_on_either_transport(keys, tmp_path, transport, command, status,
                                                                   words):
    import time

    lying = Sshd(tmp_path / "sshd", [keys["client"]], extra="ForceCommand {}".format(command))
    try:
        known = tmp_path / "known"
        known.write_text(lying.known_hosts_line())
        cfg = client_config(tmp_path / "config", {"liar": host_options(lying, keys["client"], known)})
        start = time.monotonic()
        code, out, err = run_cli(["inspect", "--ssh-config", str(cfg), "--timeout", "4", "--json", "--no-http",
                                  "--transport", transport, "liar"])
        took = time.monotonic() - start
    finally:
        lying.stop()
    (t,) = json.loads(out)["targets"]
    assert code == 3 and t["status"] == status and words in t["problems"][0]["message"], t["problems"]
    assert took < 20  # the 4 s deadline, not sleep's 30


@pytest.mark.parametrize("transport,signum", [("openssh", "SIGINT"), ("paramiko", "SIGINT"), ("openssh", "SIGTERM")])
def test_ctrl_c_ends_the_sweep_at_once_and_leaves_no_ssh_running(keys, tmp_path, transport, signum):
    """Six hosts whose probe never answers, two at a time: Ctrl-C (or SIGTERM) starts no other host and ends the
    two sessions under way (the old pool joined every queued host first: a 256-host sweep ran to its end after
    Ctrl-C; SIGTERM left the ssh processes to finish on their own)."""
    import signal
    import time

    started = tmp_path / "started"  # a file per session that began (sshd logs at ERROR only)
    started.mkdir()
    slow = Sshd(tmp_path / "sshd", [keys["client"]], extra="ForceCommand touch {}/$$; exec sleep 60".format(started))
    proc = None
    try:
        known = tmp_path / "known"
        known.write_text(slow.known_hosts_line())
        aliases = ["h{}".format(i) for i in range(6)]
        cfg = client_config(tmp_path / "config", {a: host_options(slow, keys["client"], known) for a in aliases})
        env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
        proc = subprocess.Popen([sys.executable, "-m", "kvforensics", "inspect", "--ssh-config", str(cfg), "--json",
                                 "--no-http", "--timeout", "120", "--parallel", "2", "--transport", transport,
                                 "--no-multiplex", *aliases], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=env)
        for _ in range(600):  # both first sessions running their (endless) command
            if len(os.listdir(str(started))) >= 2:
                break
            time.sleep(0.05)
        time.sleep(0.3)
        proc.send_signal(getattr(signal, signum))
        _, err = proc.communicate(timeout=60)  # not the 3 rounds of sleep 60 still queued
        assert proc.returncode == 130, err[-2000:]
        assert len(os.listdir(str(started))) == 2  # no host was started after Ctrl-C
        assert ssh_clients_naming(cfg) == []
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        slow.stop()


def test_what_ssh_wrote_before_it_exited_is_read_however_late_its_thread_wakes(monkeypatch):
    """64 hosts at once, a thread may wake from a select that timed out only after its ssh has written the answer
    and exited (waiting for the GIL): the answer is read all the same. Looking at the exit after such a select lost
    4-16 % of 128 hosts' answers (ssh exit 0, nothing read)."""
    import selectors
    import time

    from kvforensics.agent.remote import openssh

    class WakingLate(selectors.DefaultSelector):  # type: ignore[misc, valid-type]
        def select(self, timeout=None):
            got = super().select(timeout)
            if not got:
                time.sleep(1.0)  # meanwhile the child writes its answer and exits
            return got

    monkeypatch.setattr(openssh.selectors, "DefaultSelector", WakingLate)
    child = "import sys, time; sys.stdin.read(); time.sleep(0.7); print('the answer'); sys.stderr.write('bye\\n')"
    out, err, status = openssh._run(openssh.Sessions(), [sys.executable, "-c", child], b"probe",
                                    time.monotonic() + 30)
    assert (out, err, status) == (b"the answer\n", b"bye\n", 0)


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux not installed")
@pytest.mark.parametrize("typed", ["passphrase", "ctrl-c"])
def test_one_host_from_a_terminal_asks_for_the_keys_passphrase_there(server, tmp_path, typed):
    """As ``ssh HOST`` does: the prompt on the terminal, the passphrase typed, the host inspected; or Ctrl-C at the
    prompt, exit 130 and no ssh left. (An ssh in a session of its own had no terminal to ask on: auth_failed; in a
    process group of its own it would be stopped by the terminal, SIGTTOU.)"""
    import time

    locked = tmp_path / "locked"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "open sesame", "-f", str(locked)], check=True)
    server_keys = server.folder / "authorized_keys"
    before = server_keys.read_text()
    server_keys.write_text(before + Path(str(locked) + ".pub").read_text())
    known = tmp_path / "known"
    known.write_text(server.known_hosts_line())
    cfg = client_config(tmp_path / "config", {"node": host_options(server, locked, known)})
    sock, done = str(tmp_path / "tmux.sock"), tmp_path / "done"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    command = "{} -m kvforensics inspect --ssh-config {} --no-http --timeout 60 node; echo rc=$? > {}; sleep 60".format(
        sys.executable, cfg, done)  # the sleep keeps the pane to read

    def screen() -> str:
        return subprocess.run(["tmux", "-S", sock, "capture-pane", "-p"], capture_output=True, text=True).stdout

    def wait(until, seconds=30.0) -> None:
        deadline = time.time() + seconds
        while time.time() < deadline and not until():
            time.sleep(0.2)

    subprocess.run(["tmux", "-S", sock, "new-session", "-d", "-x", "120", "-y", "40", command], env=env, check=True)
    try:
        wait(lambda: "Enter passphrase for key" in screen())
        assert "Enter passphrase for key '{}'".format(locked) in screen()
        if typed == "passphrase":
            subprocess.run(["tmux", "-S", sock, "send-keys", "open sesame", "Enter"], check=True)
        else:
            subprocess.run(["tmux", "-S", sock, "send-keys", "C-c"], check=True)
        wait(done.exists)
        shown = screen()
        if typed == "passphrase":
            assert done.read_text().strip() in ("rc=0", "rc=1"), shown  # 1: no GPU here, a warning
            assert "kvforensics ssh:node" in shown and "open sesame" not in shown
        else:
            assert done.read_text().strip() == "rc=130", shown
        assert ssh_clients_naming(cfg) == []
    finally:
        subprocess.run(["tmux", "-S", sock, "kill-server"], capture_output=True)
        server_keys.write_text(before)
