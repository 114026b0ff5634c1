"""Benchmark the SSH fleet sweep: 32 loopback targets, --parallel 16, against plain ssh.

Peer, side by side: the same 32 targets with OpenSSH, `ssh -F cfg HOST python3 -c pass`, 16 at
a time (xargs -P 16). Both use a real sshd on 127.0.0.1 (tests/sshd.py), the same key, the same
known_hosts. Reports wall time, ratio, bytes sent per host and exec round trips per host.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import append, ssh_fleet  # noqa: E402
from tests.sshd import Sshd, keygen  # noqa: E402

HOSTS = int(os.environ.get("KVF_BENCH_HOSTS", "32"))
PARALLEL = 16
RUNS = int(os.environ.get("KVF_BENCH_RUNS", "3"))


def _timed(cmd, **kw):
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    return time.perf_counter() - start, proc


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="kvf-bench-ssh-"))
    key = keygen(work / "client")
    server = Sshd(work / "sshd", [key])
    try:
        cfg, aliases, env = ssh_fleet(work, server, key, HOSTS)
        kvf_times, ssh_times = [], []
        doc = None
        for _ in range(RUNS):
            t, proc = _timed([sys.executable, "-m", "agent", "inspect", "--ssh-config", str(cfg), "--parallel",
                              str(PARALLEL), "--no-http", "--json", "--fail-on", "never", *aliases], env=env,
                              cwd=str(ROOT))
            assert proc.returncode == 0, proc.stderr[-2000:]
            doc = json.loads(proc.stdout)
            kvf_times.append(t)
            t, proc = _timed(["xargs", "-P", str(PARALLEL), "-I{}", "ssh", "-F", str(cfg), "{}", "python3", "-c",
                              "pass"],
                             input="\n".join(aliases) + "\n", env=env)
            assert proc.returncode == 0, proc.stderr[-2000:]
            ssh_times.append(t)
        from agent.remote import probe

        sent = len(probe.build({"nvml_lib": None, "log": None, "startup": -1, "model_config_path": None,
                                "http": False}).script)
        assert doc is not None and all(t["status"] in ("ok", "partial") for t in doc["targets"])
    finally:
        server.stop()
    kvf, peer = min(kvf_times), min(ssh_times)
    append("fleet over SSH", [
        "| {} loopback targets, {} at a time | time | ratio |".format(HOSTS, PARALLEL), "|---|---|---|",
        "| `kvforensics inspect --parallel {} --json` (probe runs every collector) | {:.2f} s | {:.2f} "
        "|".format(PARALLEL, kvf, kvf / peer),
        "| `xargs -P {} ssh HOST python3 -c pass` (OpenSSH) | {:.2f} s | 1.00 |".format(PARALLEL, peer),
        "", "Per host: one exec round trip, {:,} bytes sent (the probe: collectors + pynvml, zipped, base64). "
        "Best of {} runs; sshd and both clients share the same 2 cores. This host has no NVIDIA driver, so the "
        "probe skips compiling pynvml; where a driver exists that adds ~50 ms of CPU per host.".format(sent, RUNS)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
