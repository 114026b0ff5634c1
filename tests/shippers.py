"""Wrap a log as what ships it would: a container runtime's CRI file, ``kubectl logs --timestamps``,
vLLM's colours on a terminal, a person pasting with ``>> ``. Bytes in, bytes out; lines are split
on ``\\n`` only (a tqdm ``\\r`` stays inside its line, as every shipper leaves it)."""

from __future__ import annotations

import re
from typing import Callable, Dict, List, Tuple


def lines_of(data: bytes) -> List[bytes]:
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return lines


def stamp(n: int, zone: bytes = b"Z") -> bytes:
    """A distinct RFC 3339 timestamp with nanoseconds for record ``n``."""
    return "2026-05-01T10:{:02d}:{:02d}.{:09d}".format(n // 60 % 60, n % 60, n * 7919 % 10**9).encode() + zone


def cri_with_map(data: bytes, split: int = 512) -> Tuple[bytes, Dict[int, int]]:
    """A CRI log file as containerd or CRI-O writes it, and {record number: line number} of each
    line's first record. Every third line goes to stderr (with a ``+00:00`` offset, as CRI-O writes
    local time); a line longer than ``split`` bytes becomes ``P`` records and one ``F`` record, and
    the other stream writes an empty line between its first two records, as the runtime
    interleaves the streams."""
    out: List[bytes] = []
    first: Dict[int, int] = {}
    for number, line in enumerate(lines_of(data), 1):
        stream, zone, other = ((b"stderr", b"+00:00", b"stdout") if number % 3 == 2 else (b"stdout", b"Z", b"stderr"))
        chunks = [line[k:k + split] for k in range(0, len(line), split)] or [b""]
        first[len(out) + 1] = number
        for k, chunk in enumerate(chunks):
            tag = b"F" if k == len(chunks) - 1 else b"P"
            out.append(stamp(len(out), zone) + b" " + stream + b" " + tag + b" " + chunk)
            if k == 0 and tag == b"P":
                out.append(stamp(len(out)) + b" " + other + b" F ")
    return b"".join(r + b"\n" for r in out), first


def cri(data: bytes) -> bytes:
    return cri_with_map(data)[0]


def kubectl(data: bytes) -> bytes:
    """``kubectl logs --timestamps`` (and ``docker logs --timestamps``)."""
    return b"".join(stamp(n) + b" " + line + b"\n" for n, line in enumerate(lines_of(data)))


_PROCESS = re.compile(rb"^\((?:[\w:.@/-]+ pid=\d+(?:, ip=[\d.:a-fA-F]+)?)\)")
_LEVEL = re.compile(rb"\b(DEBUG|INFO|WARNING|ERROR)(?= \d\d-\d\d )")
_SGLANG = re.compile(rb"^\[\d{4}-\d{2}-\d{2} [^\]]*\]")


def ansi(data: bytes) -> bytes:
    """Colour as on a terminal: vLLM's process prefix in bold cyan (its ``\\x1b[1;36m…\\x1b[0;0m``), the
    level in green, an SGLang prefix dimmed."""
    out = []
    for line in lines_of(data):
        line = _PROCESS.sub(lambda m: b"\x1b[1;36m" + m.group(0) + b"\x1b[0;0m", line)
        line = _LEVEL.sub(lambda m: b"\x1b[32m" + m.group(1) + b"\x1b[0m", line, count=1)
        line = _SGLANG.sub(lambda m: b"\x1b[2m" + m.group(0) + b"\x1b[0m", line)
        out.append(line + b"\n")
    return b"".join(out)


def pasted(data: bytes) -> bytes:
    """A log pasted with a quote marker before every line."""
    return b"".join(b">> " + line + b"\n" for line in lines_of(data))


def stacked(data: bytes) -> bytes:
    """A coloured log read with kubectl --timestamps, then pasted."""
    return pasted(kubectl(ansi(data)))


WRAPPINGS: Dict[str, Callable[[bytes], bytes]] = {
    "cri": cri, "kubectl": kubectl, "ansi": ansi, "pasted": pasted, "stacked": stacked}
