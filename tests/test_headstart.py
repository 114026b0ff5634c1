"""The head start (agent/cli/headstart.py): a one-host inspect's ssh started before typer loads, used only when the
run asks for that very ssh, and never left running. Against a real sshd, with an ``ssh`` on PATH that writes down
each time it is run and then is the system's."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kvforensics.agent.cli import headstart
from tests.sshd import SSHD, Sshd, client_config, control_folder, host_options, keygen, ssh_clients_naming

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("args,target,multiplex,timeout", [
    (["inspect", "gpu1"], "gpu1", True, 30.0),
    (["inspect", "--json", "--no-http", "--fail-on", "never", "root@gpu1:2222"], "root@gpu1:2222", True, 30.0),
    (["inspect", "gpu1", "--no-multiplex", "--timeout", "7.5", "-v"], "gpu1", False, 7.5),
    (["inspect", "--timeout=12", "--startup", "-1", "--transport", "openssh", "gpu1"], "gpu1", True, 12.0),
])
def test_a_plain_one_host_command_line_is_read_as_typer_will(args, target, multiplex, timeout):
    found = headstart.guess(args)
    assert found is not None and (found.target, found.multiplex, found.timeout_s) == (target, multiplex, timeout)


def test_its_ssh_config_and_key_are_read_in_either_spelling(tmp_path):
    key = tmp_path / "key"
    key.write_text("k")
    found = headstart.guess(["inspect", "--ssh-config=/etc/x", "-i", str(key), "gpu1"])
    assert found is not None and (found.ssh_config, found.identity) == ("/etc/x", str(key))


@pytest.mark.parametrize("args", [
    ["analyze", "log"], ["inspect"], ["inspect", "--help", "gpu1"], ["inspect", "gpu1", "gpu2"],
    ["inspect", "gpu[1-2]"], ["inspect", "gpu{1,2}"], ["inspect", "local"], ["inspect", "k8s:ml/pod"],
    ["inspect", "--accept-new-host-keys", "gpu1"], ["inspect", "--transport", "paramiko", "gpu1"],
    ["inspect", "--timeout", "0", "gpu1"], ["inspect", "--timeout", "soon", "gpu1"],
    ["inspect", "--timeout", "1e999", "gpu1"], ["inspect", "--frobnicate", "gpu1"], ["inspect", "--", "gpu1"],
    ["inspect", "-ikey", "gpu1"], ["inspect", "gpu1", "--timeout"], ["inspect", "--hosts-file", "f", "gpu1"],
    ["inspect", "--from", "bundle.json"], ["inspect", "-i", "/no/such/key", "gpu1"], ["inspect", "-gpu1"],
    ["inspect", "gpu1:notaport"], ["inspect", "--json=yes", "gpu1"],
])
def test_anything_unusual_starts_nothing(args):
    assert headstart.guess(args) is None


needs_sshd = pytest.mark.skipif(SSHD is None, reason="sshd not installed (CI installs openssh-server)")


@pytest.fixture()
def node(tmp_path):
    """A loopback sshd, an alias for it, and a PATH whose ``ssh`` logs each run (one line of its arguments)."""
    key = keygen(tmp_path / "client")
    server = Sshd(tmp_path / "sshd", [key])
    known = tmp_path / "known"
    known.write_text(server.known_hosts_line())
    cfg = client_config(tmp_path / "config", {"node": host_options(server, key, known)})
    bin_dir, runs = tmp_path / "bin", tmp_path / "ssh-runs"
    bin_dir.mkdir()
    wrapper = bin_dir / "ssh"
    wrapper.write_text("#!/bin/sh\necho \"$$ $*\" >> {}\nexec {} \"$@\"\n".format(runs, shutil.which("ssh")))
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    with control_folder() as control:
        env = dict(os.environ, PATH="{}:{}".format(bin_dir, os.environ["PATH"]), PYTHONPATH=str(ROOT),
                   XDG_CACHE_HOME=str(tmp_path / "cache"), KVFORENSICS_SSH_CONTROL_DIR=str(control))
        env.pop("SSH_AUTH_SOCK", None)
        yield cfg, runs, env
    server.stop()


def _runs(runs: Path) -> list:
    """(pid, what it was for: "-G" (the config asked) or "session" (a connection)) of each ssh run, in order."""
    got = [line.split(" ", 1) for line in runs.read_text().splitlines()]
    return [(int(pid), "-G" if args.startswith("-G") else "session") for pid, args in got if not args.startswith("-V")]


def _sessions(runs: Path) -> list:
    return [what for _, what in _runs(runs)]


@needs_sshd
@pytest.mark.parametrize("multiplex", ["--multiplex", "--no-multiplex"])
def test_one_host_is_inspected_over_the_ssh_started_before_typer_loaded(node, multiplex):
    cfg, runs, env = node
    program = textwrap.dedent("""
        import sys
        from kvforensics.agent.cli import headstart, main
        from kvforensics.agent.remote import openssh
        args = ["inspect", "--ssh-config", sys.argv[1], "--json", "--no-http", "--fail-on", "never", sys.argv[2],
                "node"]
        headstart.begin(args)
        assert "typer" not in sys.modules and len(openssh._HEAD) == 1
        sys.stderr.write("head %d\\n" % openssh._HEAD[0].proc.pid)
        headstart.begin = lambda args: None  # main's own call: this one is the head start
        sys.exit(main(args))
    """)
    done = subprocess.run([sys.executable, "-c", program, str(cfg), multiplex], capture_output=True, text=True,
                          env=env, stdin=subprocess.DEVNULL, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    (target,) = json.loads(done.stdout)["targets"]
    assert target["status"] in ("ok", "partial")
    head = int(done.stderr.split("head ", 1)[1].split()[0])
    assert [what for _, what in _runs(runs)] == ["-G", "session"]  # nothing asked twice
    assert _runs(runs)[1][0] == head  # the probe went over the ssh started ahead
    assert ssh_clients_naming(cfg) == []


@needs_sshd
def test_a_command_line_refused_after_the_head_start_leaves_no_ssh(node):
    cfg, runs, env = node
    done = subprocess.run([sys.executable, "-m", "kvforensics", "inspect", "--ssh-config", str(cfg), "--parallel",
                           "0", "--no-multiplex", "node"], capture_output=True, text=True, env=env,
                          stdin=subprocess.DEVNULL, timeout=120)
    assert done.returncode == 2 and done.stderr == "kvforensics: error: --parallel must be 1–1024, not 0\n"
    assert _sessions(runs) == ["-G", "session"]  # started ahead (--parallel is not the ssh's), then ended
    assert ssh_clients_naming(cfg) == []


@needs_sshd
def test_a_head_start_for_other_options_is_ended_and_the_run_makes_its_own(node):
    """As if the guess had read the command line otherwise than typer: the ssh started ahead is not used."""
    cfg, runs, env = node
    program = ("import sys\nfrom kvforensics.agent.remote import openssh\nfrom kvforensics.agent.cli import main, "
               "headstart\nheadstart.begin = lambda args: None\n"
               "openssh.head_start('node', openssh.Options(ssh_config=sys.argv[1], multiplex=True), 60)\n"
               "sys.exit(main(['inspect', '--ssh-config', sys.argv[1], '--json', '--no-http', '--fail-on', "
               "'never', '--no-multiplex', 'node']))\n")
    done = subprocess.run([sys.executable, "-c", program, str(cfg)], capture_output=True, env=env,
                          stdin=subprocess.DEVNULL, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["targets"][0]["status"] in ("ok", "partial")
    # the head start for other options, then the run's own ssh
    assert _sessions(runs) == ["-G", "session", "-G", "session"]
    assert ssh_clients_naming(cfg) == []
