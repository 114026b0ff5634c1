"""NVML: driver versions, and per GPU its identity, memory and the processes holding memory.

Uses nvidia-ml-py (``pynvml``), which the probe bundles; the driver's ``libnvidia-ml.so.1``
is loaded by pynvml (or from ``lib_path``, for drivers in a non-standard place). Errors are
isolated per GPU and per field: a lost GPU is reported with ``status: "lost"``, an
unsupported field is None with a problem naming it, never a crash and never a 0.

Output (a JSON-ready dict):
``{"status": "ok"|"partial"|"absent"|"failed", "driver_version", "nvml_version",
"cuda_driver_version", "gpus": [gpu...], "problems": [{"code", "message"}]}`` where each gpu is
``{"index", "status": "ok"|"lost"|"partial", "uuid", "name", "pci_bus_id", "total_bytes",
"reserved_bytes", "used_bytes", "free_bytes", "memory_api", "v1_used_bytes", "mig_mode",
"processes": [{"pid", "used_bytes", "type", "api"}], "process_api", "problems": [...]}``.
Memory semantics (nvidia-smi -q -d MEMORY shows the same four): under
``nvmlDeviceGetMemoryInfo_v2`` total = reserved + used + free and ``used`` excludes the
driver's reserve; the v1 call folds the reserve into ``used`` (kept as ``v1_used_bytes``).
"""

from __future__ import annotations

import ctypes
from typing import Any, Callable, Dict, List, Optional, Tuple

NAME = "nvml"
_NOT_AVAILABLE = (1 << 64) - 1  # NVML_VALUE_NOT_AVAILABLE_ulonglong
_BAD_PIDS = (0, 0xFFFFFFFF)  # what a process-struct size mismatch leaves behind (nvitop#75)
_IMPLAUSIBLE_BYTES = 1 << 50  # 1 PiB per process: only a shifted struct reads like that

# Every name this module reads from pynvml, those built at run time (the process-list calls) included: the
# probe ships only the part of pynvml these reach (agent/remote/shake.py). tests/test_probe_pynvml.py fails
# when a ``nv.X`` here is missing from the list.
_PROCESS_LIST = {"compute": "nvmlDeviceGetComputeRunningProcesses",
                 "graphics": "nvmlDeviceGetGraphicsRunningProcesses"}  # + "_v3", "_v2", or "" (v1)
_PROCESS_CALLS = tuple(prefix + version for prefix in _PROCESS_LIST.values() for version in ("", "_v2", "_v3"))
PYNVML_USES = ("NVMLError", "NVML_ERROR_INSUFFICIENT_SIZE", "NVML_SUCCESS", "_nvmlGetFunctionPointer",
               "_nvmlGetFunctionPointer_cache", "libLoadLock", "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex",
               "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMigMode", "nvmlDeviceGetName", "nvmlDeviceGetPciInfo_v3",
               "nvmlDeviceGetUUID", "nvmlInit", "nvmlLib", "nvmlMemory_v2", "nvmlShutdown",
               "nvmlSystemGetCudaDriverVersion", "nvmlSystemGetDriverVersion",
               "nvmlSystemGetNVMLVersion") + _PROCESS_CALLS

# One sentence per init failure, saying what to do (shared research peers.md §3.3).
_INIT_MESSAGES = {
    "LibraryNotFound": "no NVIDIA driver library (libnvidia-ml.so.1) on this machine: no NVIDIA driver is "
                       "installed, or it is outside the loader path (pass --nvml-lib PATH)",
    "DriverNotLoaded": "the NVIDIA kernel driver is not loaded (check `lsmod | grep nvidia` and dmesg)",
    "LibRmVersionMismatch": "the NVIDIA driver library and kernel module versions differ (driver upgraded "
                            "without a reboot): reboot or reload the nvidia module",
    "NoPermission": "no permission to open the NVIDIA devices (/dev/nvidia*): run as a user in the video "
                    "group or as root",
}


def _problem(code: str, message: str) -> Dict[str, str]:
    return {"code": code, "message": message}


def _err_name(exc: BaseException) -> str:
    name = type(exc).__name__
    return name[len("NVMLError_"):] if name.startswith("NVMLError_") else name


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class _V1ProcessInfo(ctypes.Structure):
    """nvmlProcessInfo_v1_t {pid, usedGpuMemory}: what pre-R450 drivers write."""

    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


def _load(lib_path: Optional[str]) -> Tuple[Any, Optional[Dict[str, str]]]:
    # No driver library, no point importing pynvml (8,000 lines in a local install, and its ctypes.util
    # import pulls in subprocess and tempfile): the library is loaded first.
    try:
        lib = ctypes.CDLL(lib_path or "libnvidia-ml.so.1")
    except OSError as exc:
        message = "cannot load {}: {}".format(lib_path, exc) if lib_path else _INIT_MESSAGES["LibraryNotFound"]
        return None, _problem("nvml.library_not_found", message)
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        return None, _problem("nvml.binding_missing", "nvidia-ml-py (pynvml) is not installed for this Python")
    if not hasattr(pynvml, "_nvmlGetFunctionPointer"):
        return None, _problem("nvml.binding_corrupt", "the 'pynvml' module found is not nvidia-ml-py "
                                                      "(uninstall the old pynvml package)")
    if lib_path:
        with pynvml.libLoadLock:
            pynvml.nvmlLib = lib
            pynvml._nvmlGetFunctionPointer_cache.clear()
    return pynvml, None


def collect(lib_path: Optional[str] = None) -> Dict[str, Any]:
    """Query every GPU once. Never raises for driver conditions."""
    section: Dict[str, Any] = {"status": "ok", "driver_version": None, "nvml_version": None,
                               "cuda_driver_version": None, "gpus": [], "problems": []}
    nv, problem = _load(lib_path)
    if nv is None:
        section.update(status="absent", problems=[problem])
        return section
    try:
        nv.nvmlInit()
    except nv.NVMLError as exc:
        name = _err_name(exc)
        message = _INIT_MESSAGES.get(name, "NVML initialisation failed: {}".format(exc))
        section.update(status="absent" if name == "LibraryNotFound" else "failed",
                       problems=[_problem("nvml." + _snake(name), message)])
        return section
    try:
        for key, fn in (("driver_version", nv.nvmlSystemGetDriverVersion),
                        ("nvml_version", nv.nvmlSystemGetNVMLVersion),
                        ("cuda_driver_version", nv.nvmlSystemGetCudaDriverVersion)):
            value, prob = _query(nv, fn)
            section[key] = _text(value) if isinstance(value, (bytes, str)) else value
            if prob:
                section["problems"].append(_problem(prob[0], "{}: {}".format(key, prob[1])))
        count, prob = _query(nv, nv.nvmlDeviceGetCount)
        if count is None:
            section.update(status="failed", problems=section["problems"] + [
                _problem(prob[0] if prob else "nvml.unknown", "cannot count GPUs: {}".format(prob[1] if prob else ""))])
            return section
        for index in range(count):
            section["gpus"].append(_gpu(nv, index))
    finally:
        try:
            nv.nvmlShutdown()
        except nv.NVMLError:
            pass
    if any(g["status"] != "ok" for g in section["gpus"]) or section["problems"]:
        section["status"] = "partial"
    return section


def _snake(name: str) -> str:
    out = []
    for i, ch in enumerate(name):
        if ch.isupper() and i:
            out.append("_")
        out.append(ch.lower())
    return "".join(out)


def _query(nv: Any, fn: Callable[..., Any], *args: Any) -> Tuple[Any, Optional[Tuple[str, str]]]:
    """The single gate for NVML calls: (value, None) or (None, (problem code, message))."""
    try:
        return fn(*args), None
    except nv.NVMLError as exc:
        return None, ("nvml." + _snake(_err_name(exc)), str(exc))


def _gpu(nv: Any, index: int) -> Dict[str, Any]:
    gpu: Dict[str, Any] = {"index": index, "status": "ok", "uuid": None, "name": None, "pci_bus_id": None,
                           "total_bytes": None, "reserved_bytes": None, "used_bytes": None, "free_bytes": None,
                           "memory_api": None, "v1_used_bytes": None, "mig_mode": None, "processes": [],
                           "process_api": None, "problems": []}
    handle, prob = _query(nv, nv.nvmlDeviceGetHandleByIndex, index)
    if handle is None:
        lost = prob is not None and prob[0] == "nvml.gpu_is_lost"
        gpu["status"] = "lost" if lost else "partial"
        gpu["problems"].append(_problem(prob[0] if prob else "nvml.unknown",
                                        "GPU {} is lost: it needs a reset or a reboot; its memory is unusable"
                                        .format(index) if lost else "GPU {}: {}".format(index, prob and prob[1])))
        return gpu
    for key, fn in (("uuid", nv.nvmlDeviceGetUUID), ("name", nv.nvmlDeviceGetName)):
        value, prob = _query(nv, fn, handle)
        gpu[key] = _text(value) if value is not None else None
        if prob:
            gpu["problems"].append(_problem(prob[0], "{}: {}".format(key, prob[1])))
    pci, prob = _query(nv, nv.nvmlDeviceGetPciInfo_v3, handle)
    gpu["pci_bus_id"] = _text(pci.busId) if pci is not None else None
    if prob:
        gpu["problems"].append(_problem(prob[0], "pci_bus_id: " + prob[1]))
    _memory(nv, handle, gpu)
    _processes(nv, handle, gpu)
    mig, prob = _query(nv, nv.nvmlDeviceGetMigMode, handle)
    gpu["mig_mode"] = bool(mig[0]) if mig is not None else None
    if gpu["problems"] and gpu["status"] == "ok":
        gpu["status"] = "partial"
    return gpu


def _memory(nv: Any, handle: Any, gpu: Dict[str, Any]) -> None:
    v2, prob = _query(nv, nv.nvmlDeviceGetMemoryInfo, handle, nv.nvmlMemory_v2)
    v1, prob1 = _query(nv, nv.nvmlDeviceGetMemoryInfo, handle)
    if v2 is not None:
        gpu.update(total_bytes=v2.total, reserved_bytes=v2.reserved, used_bytes=v2.used, free_bytes=v2.free,
                   memory_api="nvmlDeviceGetMemoryInfo_v2")
        if v1 is not None:
            gpu["v1_used_bytes"] = v1.used
        return
    if v1 is not None:
        # Pre-R510 drivers: no reserved figure; v1 used includes it, so it cannot be split out.
        gpu.update(total_bytes=v1.total, used_bytes=v1.used, free_bytes=v1.free, v1_used_bytes=v1.used,
                   memory_api="nvmlDeviceGetMemoryInfo")
        gpu["problems"].append(_problem("nvml.memory_v1_only", "nvmlDeviceGetMemoryInfo_v2 unavailable ({}): "
                                        "reserved memory unknown, used includes it".format(prob[1] if prob else "")))
        return
    code, message = prob1 or prob or ("nvml.unknown", "")
    gpu["problems"].append(_problem(code, "memory: " + message))


def _processes(nv: Any, handle: Any, gpu: Dict[str, Any]) -> None:
    seen: Dict[int, Dict[str, Any]] = {}
    apis = []
    for kind in ("compute", "graphics"):
        procs, api, problems = _process_list(nv, handle, kind)
        gpu["problems"].extend(problems)
        if api:
            apis.append(api)
        for p in procs or []:
            pid = int(p["pid"])
            if pid in seen:  # a process in both lists counts once
                continue
            seen[pid] = p
    gpu["processes"] = sorted(seen.values(), key=lambda p: p["pid"])
    gpu["process_api"] = apis[0] if apis else None


def _process_list(nv: Any, handle: Any, kind: str) -> Tuple[Optional[List[Dict[str, Any]]], Optional[str],
                                                            List[Dict[str, str]]]:
    """Try _v3, then _v2, then the v1 symbol; discard a list a struct mismatch corrupted."""
    problems: List[Dict[str, str]] = []
    prefix = _PROCESS_LIST[kind]
    calls = (("_v3", getattr(nv, prefix + "_v3", None)), ("_v2", getattr(nv, prefix + "_v2", None)),
             ("", lambda h: _v1_list(nv, prefix, h)))
    for suffix, fn in calls:
        if fn is None:
            continue
        raw, prob = _query(nv, fn, handle)
        if prob and prob[0] == "nvml.function_not_found":
            continue
        if prob:
            problems.append(_problem(prob[0], "{} processes: {}".format(kind, prob[1])))
            return None, None, problems
        procs: List[Dict[str, Any]] = [
            {"pid": int(p.pid), "used_bytes": _used(p.usedGpuMemory), "type": kind,
             "api": prefix + suffix} for p in raw]
        if any(p["pid"] in _BAD_PIDS or (p["used_bytes"] or 0) > _IMPLAUSIBLE_BYTES for p in procs):
            # R535.43-535.86 wrote a larger struct into the _v3 array: every later row is shifted.
            problems.append(_problem("nvml.process_list_corrupt",
                                     "{}{} returned a corrupt list (driver/struct mismatch); used the next "
                                     "older call".format(prefix, suffix)))
            continue
        return procs, prefix + suffix, problems
    problems.append(_problem("nvml.function_not_found", "no usable {} process list call".format(kind)))
    return None, None, problems


def _used(value: Any) -> Optional[int]:
    if value is None or value == _NOT_AVAILABLE:
        return None  # MIG without privileges, WDDM: unknown, not 0
    return int(value)


def _v1_list(nv: Any, prefix: str, handle: Any) -> List[_V1ProcessInfo]:
    fn = nv._nvmlGetFunctionPointer(prefix)
    count = ctypes.c_uint(0)
    ret = fn(handle, ctypes.byref(count), None)
    if ret == nv.NVML_SUCCESS:
        return []
    if ret != nv.NVML_ERROR_INSUFFICIENT_SIZE:
        raise nv.NVMLError(ret)
    count.value = count.value * 2 + 5
    array = (_V1ProcessInfo * count.value)()
    ret = fn(handle, ctypes.byref(count), array)
    if ret != nv.NVML_SUCCESS:
        raise nv.NVMLError(ret)
    return list(array[: count.value])

