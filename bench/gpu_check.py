"""GPU oracle check (needs an NVIDIA GPU, nvidia-smi and torch): `make gpu-check`.

A child process allocates a known block with torch and holds it; then the NVML collector,
`nvidia-smi` and the child's `torch.cuda.mem_get_info` are read side by side. Checks:
* totals agree exactly (nvidia-smi prints MiB: compare in MiB);
* used/free/reserved agree with nvidia-smi within 2 MiB (its MiB rounding), on every GPU;
* the holder's PID is in the collector's process list with at least the allocation;
* the collector's free on the holder's GPU is within 64 MiB of torch's free (device-wide both).
Prints every figure and exits 1 on a mismatch. Not part of `make test` (no GPU there).
"""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from collectors import nvml  # noqa: E402

MIB = 1 << 20
ALLOC_BYTES = int(os.environ.get("KVF_GPU_CHECK_BYTES", 4 << 30))
HOLDER = """
import json, sys, time, torch
x = torch.empty({n}, dtype=torch.uint8, device="cuda:0")
torch.cuda.synchronize()
free, total = torch.cuda.mem_get_info(0)
print(json.dumps({{"free": free, "total": total, "allocated": torch.cuda.memory_allocated(0),
                  "reserved": torch.cuda.memory_reserved(0)}}), flush=True)
sys.stdin.read()
"""


def smi(query: str, kind: str = "gpu") -> list:
    out = subprocess.run(["nvidia-smi", "--query-{}={}".format(kind, query), "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True, timeout=30).stdout
    return [[c.strip() for c in row] for row in csv.reader(io.StringIO(out)) if row]


def main() -> int:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER.format(n=ALLOC_BYTES)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    failures = []
    try:
        torch_view = json.loads(holder.stdout.readline())
        time.sleep(0.5)
        section = nvml.collect()
        gpus = smi("index,memory.total,memory.used,memory.free,memory.reserved")
        apps = smi("pid,used_memory", "compute-apps")
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    print("collector:", json.dumps({k: section[k] for k in ("status", "driver_version", "nvml_version")}))
    print("torch (holder, cuda:0):", torch_view)
    for row in gpus:
        index, total, used, free, reserved = (int(float(x)) for x in row)
        g = section["gpus"][index]
        mine = {k: (g[k + "_bytes"] or 0) / MIB for k in ("total", "used", "free", "reserved")}
        print("GPU {}: nvidia-smi total/used/free/reserved MiB = {}/{}/{}/{}; collector = {:.1f}/{:.1f}/{:.1f}/{:.1f} "
              "({})".format(
            index, total, used, free, reserved, mine["total"], mine["used"], mine["free"], mine["reserved"],
            g["memory_api"]))
        if int(mine["total"]) != total:
            failures.append("GPU {} total {} MiB vs nvidia-smi {}".format(index, mine["total"], total))
        for key, theirs in (("used", used), ("free", free), ("reserved", reserved)):
            if abs(mine[key] - theirs) > 2:
                failures.append("GPU {} {} {:.1f} MiB vs nvidia-smi {} MiB".format(index, key, mine[key], theirs))
    procs = {p["pid"]: p for p in section["gpus"][0]["processes"]}
    print("GPU 0 processes (collector):", procs)
    print("compute apps (nvidia-smi):", apps)
    held = procs.get(holder.pid)
    if held is None:
        failures.append("holder PID {} not in the collector's process list (PID namespace?)".format(holder.pid))
    elif (held["used_bytes"] or 0) < ALLOC_BYTES:
        failures.append("holder uses {} B per NVML, less than the {} B allocated".format(held["used_bytes"],
                                                                                         ALLOC_BYTES))
    gap = abs((section["gpus"][0]["free_bytes"] or 0) - torch_view["free"]) / MIB
    print("free on GPU 0: collector vs torch.cuda.mem_get_info differ by {:.1f} MiB".format(gap))
    if gap > 64:
        failures.append("collector free differs from torch's by {:.1f} MiB".format(gap))
    for f in failures:
        print("MISMATCH:", f)
    print("gpu-check: {} passed, {} failed".format(4 * len(gpus) + 2 - len(failures), len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
