"""GPU oracle check on a real NVIDIA GPU, with nothing beyond the project's venv: `make gpu-check`.

A child process allocates a known block through the CUDA driver API (libcuda.so.1 via ctypes:
cuInit, cuDeviceGet, cuCtxCreate, cuMemAlloc, cuMemGetInfo) and holds it. The NVML collector and
`nvidia-smi` are read before and after, side by side. Checks:
* totals agree exactly (nvidia-smi prints MiB: compare in MiB);
* used/free/reserved agree with nvidia-smi within 2 MiB (its MiB rounding), on every GPU;
* the holder's PID is in the collector's process list, with at least the allocation, and the
  collector's per-process figure matches `nvidia-smi --query-compute-apps` within 2 MiB;
* free memory dropped by at least the allocation between before and after;
* the collector's free on the holder's GPU is within 64 MiB of CUDA's own cuMemGetInfo free.
Prints every figure, writes them as JSON to $KVF_GPU_CHECK_OUT (if set), exits 1 on a mismatch.

On a lent GPU machine with no network, from a checkout whose .venv was built here:
    .venv/bin/python bench/gpu_check.py        (or: make gpu-check)
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

from bench.common import CUDA_CONTEXT_PROGRAM  # noqa: E402
from kvforensics.collectors import nvml  # noqa: E402

MIB = 1 << 20
ALLOC_BYTES = int(os.environ.get("KVF_GPU_CHECK_BYTES", 4 << 30))
DEVICE = int(os.environ.get("KVF_GPU_CHECK_DEVICE", "0"))

# The holder: the CUDA driver API directly (what torch's allocator calls underneath).
HOLDER = CUDA_CONTEXT_PROGRAM + r"""
free0, total = ctypes.c_size_t(), ctypes.c_size_t()
check(cuda.cuMemGetInfo_v2(ctypes.byref(free0), ctypes.byref(total)), "cuMemGetInfo")
ptr = ctypes.c_uint64()
check(cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(NBYTES)), "cuMemAlloc")
check(cuda.cuMemsetD8_v2(ptr, 0, ctypes.c_size_t(NBYTES)), "cuMemsetD8")  # touch it: really backed
check(cuda.cuCtxSynchronize(), "cuCtxSynchronize")
free1 = ctypes.c_size_t()
check(cuda.cuMemGetInfo_v2(ctypes.byref(free1), ctypes.byref(total)), "cuMemGetInfo")
print(json.dumps({"free_after_context": free0.value, "free_after_alloc": free1.value, "total": total.value}),
      flush=True)
sys.stdin.read()
"""


def smi(query: str, kind: str = "gpu") -> list:
    out = subprocess.run(["nvidia-smi", "--query-{}={}".format(kind, query), "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True, timeout=30).stdout
    return [[c.strip() for c in row] for row in csv.reader(io.StringIO(out)) if row]


def look() -> dict:
    """The collector and nvidia-smi, read back to back."""
    return {"collector": nvml.collect(), "smi": smi("index,memory.total,memory.used,memory.free,memory.reserved"),
            "apps": smi("pid,used_memory", "compute-apps")}


def compare_gpus(view: dict, label: str, failures: list) -> None:
    section = view["collector"]
    for row in view["smi"]:
        index, total, used, free, reserved = (int(float(x)) for x in row)
        g = section["gpus"][index]
        mine = {k: (g[k + "_bytes"] or 0) / MIB for k in ("total", "used", "free", "reserved")}
        print("{} GPU {}: nvidia-smi total/used/free/reserved MiB = {}/{}/{}/{}; collector = "
              "{:.1f}/{:.1f}/{:.1f}/{:.1f} ({})".format(label, index, total, used, free, reserved, mine["total"],
                                                        mine["used"], mine["free"], mine["reserved"],
                                                        g.get("memory_api")))
        if int(mine["total"]) != total:
            failures.append("{} GPU {} total {} MiB vs nvidia-smi {}".format(label, index, mine["total"], total))
        for key, theirs in (("used", used), ("free", free), ("reserved", reserved)):
            if abs(mine[key] - theirs) > 2:
                failures.append("{} GPU {} {} {:.1f} MiB vs nvidia-smi {} MiB".format(label, index, key, mine[key],
                                                                                     theirs))


def compare_holder(after: dict, pid: int, cuda_view: dict, before_free: int, failures: list) -> None:
    gpu = after["collector"]["gpus"][DEVICE]
    procs = {p["pid"]: p for p in gpu["processes"]}
    print("GPU {} processes (collector):".format(DEVICE), procs)
    print("compute apps (nvidia-smi):", after["apps"])
    held = procs.get(pid)
    if held is None:
        failures.append("holder PID {} not in the collector's process list (PID namespace?)".format(pid))
    else:
        if (held["used_bytes"] or 0) < ALLOC_BYTES:
            failures.append("holder uses {} B per NVML, less than the {} B allocated".format(held["used_bytes"],
                                                                                             ALLOC_BYTES))
        smi_used = next((int(float(u)) for p, u in after["apps"] if p.isdigit() and int(p) == pid), None)
        if smi_used is None or abs((held["used_bytes"] or 0) / MIB - smi_used) > 2:
            failures.append("holder: collector {} B vs nvidia-smi {} MiB".format(held["used_bytes"], smi_used))
    dropped = before_free - (gpu["free_bytes"] or 0)
    print("free on GPU {} dropped by {:.1f} MiB for a {:.1f} MiB allocation".format(DEVICE, dropped / MIB,
                                                                                    ALLOC_BYTES / MIB))
    if dropped < ALLOC_BYTES:
        failures.append("free dropped by {} B, less than the {} B allocated".format(dropped, ALLOC_BYTES))
    gap = abs((gpu["free_bytes"] or 0) - cuda_view["free_after_alloc"]) / MIB
    print("free on GPU {}: collector vs cuMemGetInfo differ by {:.1f} MiB".format(DEVICE, gap))
    if gap > 64:
        failures.append("collector free differs from CUDA's by {:.1f} MiB".format(gap))


def main() -> int:
    before = look()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER.replace("NBYTES", str(ALLOC_BYTES))
                               .replace("DEVICE", str(DEVICE))], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    failures: list = []
    try:
        cuda_view = json.loads(holder.stdout.readline() or '{"error": "the holder printed nothing"}')
        if "error" in cuda_view:
            print("gpu-check: the CUDA holder failed:", cuda_view["error"])
            return 1
        time.sleep(0.5)
        after = look()
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    print("collector:", json.dumps({k: after["collector"][k] for k in ("status", "driver_version", "nvml_version")}))
    print("CUDA (holder, device {}):".format(DEVICE), cuda_view)
    compare_gpus(before, "before", failures)
    compare_gpus(after, "after", failures)
    compare_holder(after, holder.pid, cuda_view, before["collector"]["gpus"][DEVICE]["free_bytes"] or 0, failures)
    for f in failures:
        print("MISMATCH:", f)
    checks = 8 * len(after["smi"]) + 5
    print("gpu-check: {} passed, {} failed".format(checks - len(failures), len(failures)))
    out = os.environ.get("KVF_GPU_CHECK_OUT")
    if out:
        Path(out).write_text(json.dumps({"before": before, "after": after, "cuda": cuda_view,
                                         "failures": failures}, indent=1, default=str))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
