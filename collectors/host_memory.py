"""Host memory: /proc/meminfo, and the cgroup limit when running inside a container.

Output: ``{"status", "total_bytes", "available_bytes", "swap_total_bytes", "swap_free_bytes",
"cgroup_limit_bytes", "cgroup_usage_bytes", "problems"}``. /proc/meminfo sizes are kB (×1024).
``available_bytes`` is MemAvailable (what ``free -h`` shows as "available"), lowered to the
cgroup's remaining room when a limit is set (the same bound SGLang 0.5.19+ uses for HiCache).
Read directly, not through psutil: psutil reads the same file, and the probe must run on a bare
python3.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional

NAME = "host_memory"
_UNLIMITED = 1 << 62  # cgroup v1 "no limit" is a page-rounded 2**63 - 1


def parse_meminfo(text: str) -> Dict[str, int]:
    """{key: bytes} from /proc/meminfo text ("MemTotal:  1234 kB")."""
    out: Dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if not parts or not parts[0].isdigit():
            continue
        value = int(parts[0])
        out[key.strip()] = value * 1024 if len(parts) > 1 and parts[1] == "kB" else value
    return out


def _read(path: str) -> Optional[str]:
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _cgroup_limit(root: str) -> Dict[str, Optional[int]]:
    """memory.max/memory.current (v2) or memory.limit_in_bytes/usage_in_bytes (v1) of our cgroup."""
    own = _read(os.path.join(root, "proc", "self", "cgroup")) or ""
    paths = []
    for line in own.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and (parts[0] == "0" or "memory" in parts[1].split(",")):
            paths.append((parts[0] == "0", parts[2]))
    for v2, rel in paths:
        base = os.path.join(root, "sys", "fs", "cgroup")
        if not v2:
            base = os.path.join(base, "memory")
        for folder in (os.path.join(base, rel.lstrip("/")), base):
            limit_file = "memory.max" if v2 else "memory.limit_in_bytes"
            usage_file = "memory.current" if v2 else "memory.usage_in_bytes"
            limit = _read(os.path.join(folder, limit_file))
            if limit is None:
                continue
            limit = limit.strip()
            usage = (_read(os.path.join(folder, usage_file)) or "").strip()
            value = None if limit == "max" or not limit.isdigit() or int(limit) >= _UNLIMITED else int(limit)
            return {"cgroup_limit_bytes": value, "cgroup_usage_bytes": int(usage) if usage.isdigit() else None}
    return {"cgroup_limit_bytes": None, "cgroup_usage_bytes": None}


def collect(root: str = "/") -> Dict[str, Any]:
    section: Dict[str, Any] = {"status": "ok", "total_bytes": None, "available_bytes": None,
                               "swap_total_bytes": None, "swap_free_bytes": None, "cgroup_limit_bytes": None,
                               "cgroup_usage_bytes": None, "problems": []}
    text = _read(os.path.join(root, "proc", "meminfo"))
    if text is None:
        section["status"] = "failed"
        section["problems"].append({"code": "host_memory.unreadable", "message": "cannot read /proc/meminfo"})
        return section
    info = parse_meminfo(text)
    section["total_bytes"] = info.get("MemTotal")
    section["available_bytes"] = info.get("MemAvailable")
    section["swap_total_bytes"] = info.get("SwapTotal")
    section["swap_free_bytes"] = info.get("SwapFree")
    section.update(_cgroup_limit(root))
    limit, usage = section["cgroup_limit_bytes"], section["cgroup_usage_bytes"]
    if limit is not None and usage is not None and section["available_bytes"] is not None:
        section["available_bytes"] = min(section["available_bytes"], max(0, limit - usage))
    if section["available_bytes"] is None:
        section["status"] = "partial"
        section["problems"].append({"code": "host_memory.no_memavailable",
                                    "message": "MemAvailable missing from /proc/meminfo (kernel < 3.14)"})
    return section
