"""Hostile kubectl stand-ins and targets: each bad answer costs one target, never the run; the deadline, Ctrl-C
and SIGTERM end every kubectl with what it forked; nothing is left in /tmp; nothing kubectl prints reaches the
terminal raw.

``kubectl`` here is a shell script at the lowest layer (no API server can run here): ``exec`` runs the probe on
this host (``python3 -I -`` as kubectl would run it in the pod), ``get pod`` prints what the test wants,
``logs`` prints nothing, or hangs with a child of its own. Hang guards only, no timing assertions."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli

GUARD_S = 120
DEEP = "[" * 200000 + "]" * 200000


def _kubectl(tmp_path: Path, monkeypatch, get: str = "{}", logs: str = ":", stderr: str = "") -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (tmp_path / "get.json").write_text(get)
    script = bin_dir / "kubectl"
    script.write_text("""#!/bin/sh
{stderr}
case "$1" in
  exec) while [ "$1" != "--" ]; do shift; done; shift; exec "$@" ;;
  get) cat {get} ;;
  logs) {logs} ;;
esac
""".format(stderr=stderr, get=tmp_path / "get.json", logs=logs))
    script.chmod(0o755)
    monkeypatch.setenv("PATH", "{}{}{}".format(bin_dir, os.pathsep, os.environ.get("PATH", "")))
    return bin_dir


def _gone(pid: int) -> bool:
    for _ in range(GUARD_S * 10):
        try:
            with open("/proc/{}/stat".format(pid)) as f:
                if f.read().split(")")[-1].split()[0] == "Z":
                    return True  # a zombie: dead, not yet reaped by its (already gone) parent
        except OSError:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("get", [json.dumps({"metadata": {"name": "p", "namespace": "ns", "uid": "u-1"},
                                             "spec": {"containers": 5}, "status": 7}),
                                 json.dumps({"metadata": {"name": "p", "namespace": "ns", "uid": "u-1",
                                                          "annotations": {
                                                              "kubectl.kubernetes.io/default-container": ["x"]}},
                                             "spec": {"containers": [{"name": 3}, "c", {"name": "app"}]}}),
                                 DEEP], ids=["odd-types", "odd-annotation", "nested-200000"])
def test_an_odd_pod_object_costs_nothing_but_its_own_fields(tmp_path, monkeypatch, get):
    _kubectl(tmp_path, monkeypatch, get=get)
    code, out, err = run_cli(["inspect", "k8s:ns/p", "k8s:ns/q", "--json", "--timeout", "60"])
    assert code in (0, 1, 3), err
    targets = json.loads(out)["targets"]
    assert [t["target"] for t in targets] == ["k8s:ns/p", "k8s:ns/q"]
    assert all(t["status"] in ("ok", "partial") for t in targets), [t["problems"] for t in targets]


def test_the_deadline_kills_kubectl_and_what_it_forked(tmp_path, monkeypatch):
    child = tmp_path / "child.pid"
    _kubectl(tmp_path, monkeypatch, logs="sleep 300 & echo $! > {} ; wait".format(child))
    code, out, err = run_cli(["inspect", "k8s:ns/p", "--timeout", "5", "--json"])
    assert code in (0, 1, 3), err
    pid = int(child.read_text())
    assert _gone(pid), "kubectl's child {} outlived the deadline".format(pid)


def test_a_flood_on_stderr_is_capped_in_memory_and_printed_clean(tmp_path, monkeypatch):
    """50 MB on stderr with terminal escapes (a title change, a screen clear) in the line that is shown."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    flood = r"head -c 50000000 /dev/zero | tr '\0' x >&2; printf '\n\033]0;pwned\007\033[2JError: boom\n' >&2; exit 1"
    _kubectl(tmp_path, monkeypatch, stderr=flood)
    code, out, err = run_cli(["inspect", "k8s:ns/p", "--timeout", "60"])
    assert code == 3 and err.count("\n") == 1 and "\x1b" not in err and "\x07" not in err, err[:300]
    assert "Error: boom" in err and len(err) < 4096
    assert list(tmp.iterdir()) == []  # nothing spooled to /tmp


@pytest.mark.parametrize("signum,code", [(signal.SIGTERM, 130), (signal.SIGINT, 130)])
def test_sigterm_and_ctrl_c_end_the_run_at_once_and_leave_nothing_in_tmp(tmp_path, monkeypatch, signum, code):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    child = tmp_path / "child.pid"
    _kubectl(tmp_path, monkeypatch, logs="sleep 300 & echo $! > {} ; wait".format(child))
    env = dict(os.environ, TMPDIR=str(tmp), PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "kvforensics", "inspect", "k8s:ns/p", "--timeout", "100"], env=env,
                            cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        for _ in range(GUARD_S * 10):  # until kubectl logs runs (its temporary folder exists by then)
            if child.exists() and child.read_text().strip():
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.1)
        assert [p.name for p in tmp.iterdir() if p.name.startswith("kvf-k8s-")]
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=GUARD_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, err
    assert b"Traceback" not in err
    assert list(tmp.iterdir()) == []
    assert _gone(int(child.read_text()))


def test_a_range_is_counted_before_it_is_expanded():
    code, out, err = run_cli(["inspect", "gpu-[0-9999][0-9999]-node"])
    assert code == 2 and "more than 10,000 hosts after expanding ranges" in err and err.count("\n") == 1


@pytest.mark.parametrize("target", ["k8s:ns/pod\n", "k8s:ns\n/pod", "k8s:ns/pod/c\n"])
def test_a_trailing_newline_is_not_a_kubernetes_name(tmp_path, monkeypatch, target):
    bin_dir = _kubectl(tmp_path, monkeypatch)
    calls = tmp_path / "called"
    (bin_dir / "kubectl").write_text("#!/bin/sh\ntouch {}\nexit 1\n".format(calls))
    code, out, err = run_cli(["inspect", target])
    assert code == 2 and "k8s:NAMESPACE/POD[/CONTAINER]" in err and "\\n" in err and not calls.exists()
