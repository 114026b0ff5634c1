"""Benchmark the SSH fleet sweep against plain ssh: 32 loopback targets 16 at a time (default), or any
``KVF_BENCH_HOSTS`` / ``KVF_BENCH_PARALLEL`` (``KVF_BENCH_HOSTS=256`` runs 64 at a time unless told).

Peer, side by side: the same targets with OpenSSH, `ssh -F cfg HOST python3 -c pass`, as many at a time
(xargs -P). Both use a real sshd on 127.0.0.1 (tests/sshd.py, MaxStartups 100:30:200, so 64 handshakes
at once are never dropped), the same key, the same known_hosts. Runs alternate kvforensics/ssh so both
see the same load; medians (and best) of ``KVF_BENCH_RUNS``. Reported: wall time, ratio, the kvforensics
client's peak RSS (ru_maxrss of the child from os.wait4), the CPU of the client and of the host side
(sshd, its sessions and what they ran: the sshd's reaped children), and the bytes sent per host.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import append, ssh_fleet  # noqa: E402
from tests.install import install_copy  # noqa: E402
from tests.sshd import Sshd, keygen  # noqa: E402

HOSTS = int(os.environ.get("KVF_BENCH_HOSTS", "32"))
PARALLEL = int(os.environ.get("KVF_BENCH_PARALLEL", "64" if HOSTS >= 256 else "16"))
RUNS = int(os.environ.get("KVF_BENCH_RUNS", "3"))
TRANSPORT = os.environ.get("KVF_BENCH_TRANSPORT", "openssh")  # openssh | paramiko
# OpenSSH: "1" shares a master per host across runs (after the first run every look is one exec round trip);
# "0" pays a handshake each time, as the ssh peer does.
MULTIPLEX = os.environ.get("KVF_BENCH_MULTIPLEX", "0") == "1"


def _own_peak_rss() -> float:
    """This process's peak RSS (VmHWM): a child forked from it reports at least that as ru_maxrss."""
    with open("/proc/self/status") as f:
        return next(float(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def _children_cpu(pid: int) -> float:
    """CPU seconds of the reaped children of ``pid`` (the sshd: every connection's processes)."""
    with open("/proc/{}/stat".format(pid)) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")  # cutime, cstime


def _timed(cmd: List[str], sshd_pid: int, stdin: bytes, env: Dict[str, str]) -> Tuple[Dict[str, float], bytes]:
    """One run: wall s, the child's CPU s and peak RSS bytes (os.wait4), the host side's CPU s; its stdout."""
    host_before = _children_cpu(sshd_pid)
    out = tempfile.TemporaryFile()
    start = time.perf_counter()
    # not the checkout: `-m kvforensics` from there would import its sources, not the installed package
    proc = subprocess.Popen(cmd, cwd=tempfile.gettempdir(), stdin=subprocess.PIPE, stdout=out, stderr=subprocess.PIPE,
                            env=env)
    proc.stdin.write(stdin)
    proc.stdin.close()
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    assert code == 0 or (code == 3 and cmd[0].endswith("kvforensics")), (code, err[-2000:])  # 3: _check says which
    time.sleep(0.5)  # the last sessions' processes are reaped by sshd just after the client returns
    out.seek(0)
    return {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "rss": usage.ru_maxrss * 1024.0,
            "host_cpu": _children_cpu(sshd_pid) - host_before}, out.read()


def _check(doc: Dict) -> None:
    """Every target collected (a dropped connection would make the run cheaper, not faster)."""
    bad = [(t["target"], t["status"], t["problems"][:1]) for t in doc["targets"]
           if t["status"] not in ("ok", "partial")]
    assert len(doc["targets"]) == HOSTS and not bad, (len(bad), bad[:3])


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="kvf-bench-ssh-"))
    key = keygen(work / "client")
    server = Sshd(work / "sshd", [key])
    kvf: List[Dict[str, float]] = []
    ssh: List[Dict[str, float]] = []
    control = tempfile.mkdtemp(prefix="kvf-cm-")
    try:
        cfg, aliases, env = ssh_fleet(work, server, key, HOSTS)
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # measure what an installed user runs: cached bytecode
        # as users run it: pip's install, bytecode compiled, and its console script (not `python -m`, whose runpy
        # costs every start ~3 ms more)
        script = install_copy(ROOT, work) / "bin" / "kvforensics"
        env["KVFORENSICS_SSH_CONTROL_DIR"] = control
        kvf_cmd = [str(script), "inspect", "--ssh-config", str(cfg), "--parallel",
                   str(PARALLEL),
                   "--no-http", "--json", "--fail-on", "never", "--timeout", "600", "--transport", TRANSPORT,
                   "--multiplex" if MULTIPLEX else "--no-multiplex", *aliases]  # as ssh: no deadline
        if MULTIPLEX:  # the masters up before the measured runs: "a second look"
            _check(json.loads(_timed(kvf_cmd, server.proc.pid, b"", env)[1]))
        ssh_cmd = ["xargs", "-P", str(PARALLEL), "-I{}", "ssh", "-F", str(cfg), "{}", "python3", "-c", "pass"]
        own = _own_peak_rss()
        for _ in range(RUNS):
            got, stdout = _timed(kvf_cmd, server.proc.pid, b"", env)
            _check(json.loads(stdout))
            kvf.append(got)
            ssh.append(_timed(ssh_cmd, server.proc.pid, ("\n".join(aliases) + "\n").encode(), env)[0])
        from kvforensics.agent.remote import probe

        sent = len(probe.build({"nvml_lib": None, "log": None, "startup": -1, "model_config_path": None,
                                "http": False, "time_limit_s": 30.0}).script)
    finally:
        for sock in os.listdir(control):
            subprocess.run(["ssh", "-o", "ControlPath={}/{}".format(control, sock), "-O", "exit", "x"],
                           capture_output=True)
        server.stop()
    append("fleet over SSH, {} hosts, {} at a time, transport {}{}".format(
        HOSTS, PARALLEL, TRANSPORT, " with live master connections" if MULTIPLEX else ""), _table(kvf, ssh, sent, own))
    return 0


def _table(kvf: List[Dict[str, float]], ssh: List[Dict[str, float]], sent: int, own: float) -> List[str]:
    def med(rows: List[Dict[str, float]], k: str) -> float:
        return statistics.median(r[k] for r in rows)

    peer = med(ssh, "wall")
    load = os.getloadavg()
    return [
        "| {} loopback targets, {} at a time | wall (median) | best | ratio (medians) | client CPU | host CPU "
        "| client peak RSS |".format(HOSTS, PARALLEL), "|---|---|---|---|---|---|---|",
        "| `kvforensics inspect --parallel {} --json` (pip-installed; the probe runs every collector) | {:.2f} s "
        "| {:.2f} s | {:.2f} | {:.2f} s | {:.2f} s | {:.0f} MB |".format(
            PARALLEL, med(kvf, "wall"), min(r["wall"] for r in kvf), med(kvf, "wall") / peer, med(kvf, "cpu"),
            med(kvf, "host_cpu"), max(r["rss"] for r in kvf) / 1e6),
        "| `xargs -P {} ssh HOST python3 -c pass` (OpenSSH) | {:.2f} s | {:.2f} s | 1.00 | {:.2f} s | {:.2f} s "
        "| — |".format(PARALLEL, peer, min(r["wall"] for r in ssh), med(ssh, "cpu"), med(ssh, "host_cpu")),
        "", "Per host: one exec round trip, {:,} bytes sent (the probe: collectors + pynvml, one xz stream, base64). "
        "{} alternating runs each; kvforensics ratios per run: {}. Client CPU: the kvforensics process, or xargs "
        "and every ssh; host CPU: sshd's reaped children (its sessions, the shell, python3). Peak RSS: the most "
        "of the runs (ru_maxrss, which also counts the pages of the process it was forked from: this bench's peak "
        "then was {:.0f} MB). sshd and "
        "both clients share the same {} cores; load average at the end {:.1f} / {:.1f} / {:.1f} (other jobs ran "
        "on the machine). The probe finds whatever engine processes the machine runs.".format(
            sent, len(kvf), ", ".join("{:.2f}".format(k["wall"] / s["wall"]) for k, s in zip(kvf, ssh)), own / 1e6,
            os.cpu_count(), *load)]


if __name__ == "__main__":
    sys.exit(main())
