"""What every benchmark shares: the machine line, timing a command, appending to RESULTS.md."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "RESULTS.md"


def machine() -> str:
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return "{} · {} cores · {} · Python {}".format(cpu, os.cpu_count(), platform.platform(), platform.python_version())


def run(cmd: Sequence[str], env=None) -> Tuple[float, int, int]:
    """(wall seconds, peak RSS bytes, exit code) of one run.

    stdout goes to a real file: GNU grep stops at the first match when its output is
    /dev/null, which would time a different job.
    """
    out = tempfile.TemporaryFile()
    start = time.perf_counter()
    proc = subprocess.Popen(list(cmd), cwd=str(ROOT), stdout=out, stderr=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    out.close()
    return wall, usage.ru_maxrss * 1024, os.waitstatus_to_exitcode(status)


def best(cmd: Sequence[str], runs: int, env=None) -> Tuple[float, int, int]:
    results = [run(cmd, env) for _ in range(runs)]
    return min(r[0] for r in results), max(r[1] for r in results), results[-1][2]


def append(title: str, lines: List[str]) -> str:
    """Append a dated section with the machine to bench/RESULTS.md; returns its text."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    text = "\n".join(["", "## {} — {}".format(title, stamp), "", "Machine: {}".format(machine()), ""] + lines + [""])
    print(text)
    with open(RESULTS, "a", encoding="utf-8") as f:
        f.write(text)
    return text


def write_log(path: Path, startup: bytes, noise: bytes, size: int, first: bool) -> None:
    """A ``size``-byte log of repeated ``noise`` lines with one ``startup`` at the very beginning
    (``first``) or near the end, followed by a little runtime."""
    with open(path, "wb") as f:
        if first:
            f.write(startup)
        written = 0
        while written < size - len(startup) - 4 * len(noise):
            f.write(noise)
            written += len(noise)
        if not first:
            f.write(startup)
            f.write(noise[:1 << 20])


# The start of a child program that holds GPU memory through the CUDA driver API (libcuda.so.1 via
# ctypes: what torch's allocator calls underneath), for bench/gpu_check.py and bench/gpu_live.py: it
# defines ``cuda`` and ``check`` and creates a context on device DEVICE. Standard library only.
CUDA_CONTEXT_PROGRAM = r"""
import ctypes, json, os, sys, time
cuda = ctypes.CDLL("libcuda.so.1")
def check(rc, what):
    if rc != 0:
        print(json.dumps({"error": "{} returned CUresult {}".format(what, rc)}), flush=True)
        sys.exit(1)
check(cuda.cuInit(0), "cuInit")
dev = ctypes.c_int()
check(cuda.cuDeviceGet(ctypes.byref(dev), DEVICE), "cuDeviceGet")
ctx = ctypes.c_void_p()
check(cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev), "cuCtxCreate")
"""


def ssh_fleet(work: Path, server: Any, key: Path, hosts: int) -> Tuple[Path, List[str], Dict[str, str]]:
    """An ssh config naming ``hosts`` aliases of one loopback sshd (strict host keys, batch mode), the
    aliases, and an environment without an agent: what kvforensics and plain ssh are both given."""
    from tests.sshd import USER, client_config

    known = work / "known_hosts"
    known.write_text(server.known_hosts_line())
    aliases = ["h{:02d}".format(i) for i in range(hosts)]
    cfg = client_config(work / "ssh_config", {a: {
        "HostName": "127.0.0.1", "Port": server.port, "User": USER, "IdentityFile": key, "IdentitiesOnly": "yes",
        "UserKnownHostsFile": known, "BatchMode": "yes", "StrictHostKeyChecking": "yes"} for a in aliases})
    env = dict(os.environ)
    env.pop("SSH_AUTH_SOCK", None)
    return cfg, aliases, env

