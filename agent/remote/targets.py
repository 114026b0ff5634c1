"""The hosts a command is about: as typed, from a hosts file, and with ranges expanded.

Kept apart from the SSH fleet (paramiko costs ~150 ms to import) so naming hosts is cheap.
"""

from __future__ import annotations

import re
from typing import List, Optional, Sequence, Tuple

MAX_EXPANDED_HOSTS = 10000
# pdsh/ClusterShell: gpu-[01-64,70]. A range never holds ':', so [::1] and [fe80::1%eth0] are IPv6
# literals (OpenSSH's [v6addr]:port), kept as typed.
_BRACKETS = re.compile(r"\[([^\[\]:]*)\]")
_V6_LITERAL = re.compile(r"\[[^\[\]]*:[^\[\]]*\]")
_BRACES = re.compile(r"\{([^{}]*)\}")  # bash: gpu-{01..64}, {a,b}


def expand_targets(names: Sequence[str]) -> List[str]:
    """Host ranges expanded here, as pdsh and bash would (so a cron line or /bin/sh, where braces
    do not expand, still works): ``gpu-[01-64]``, ``gpu-[1-3,7]``, ``gpu-{01..64}``, ``{a,b}-node``.
    Zero padding follows the range's first bound. ValueError names a bad pattern."""
    total = 0
    for name in names:  # counted before anything is expanded: n[0-9999][0-9999] is 10^8 names, not 20,000
        total += _size(name)
        if total > MAX_EXPANDED_HOSTS:
            raise ValueError("more than {:,} hosts after expanding ranges".format(MAX_EXPANDED_HOSTS))
    out: List[str] = []
    for name in names:
        out.extend(_expand(name))
    return out


def _size(name: str) -> int:
    """How many names ``name`` expands to, without expanding it (stops counting past the cap)."""
    count = 1
    while count <= MAX_EXPANDED_HOSTS:
        m = _BRACKETS.search(name) or _BRACES.search(name)
        if m is None:
            return count
        body = m.group(1)
        if m.group(0).startswith("["):
            sizes = [_range_size(part, "-", name) for part in body.split(",")]
        elif ".." in body:
            sizes = [_range_size(body, "..", name)]
        else:
            sizes = [len(body.split(","))]
        count *= sum(sizes)
        name = name[:m.start()] + "0" + name[m.end():]  # one of its items: the rest counts the same for each
    return count


def _range_size(part: str, sep: str, name: str) -> int:
    if sep not in part:
        return 1
    lo, _, hi = part.partition(sep)
    if not (lo.isdigit() and hi.isdigit()) or len(lo) > 9 or len(hi) > 9:
        raise ValueError("{!r}: a range is two numbers, like 01{}64".format(name, sep))
    return abs(int(hi) - int(lo)) + 1


def _expand(name: str) -> List[str]:
    m = _BRACKETS.search(name) or _BRACES.search(name)
    if m is None:
        if any(c in _V6_LITERAL.sub("", name) for c in "[]{}"):
            raise ValueError("{!r}: unbalanced brackets or braces in a host range".format(name))
        return [name]
    body = m.group(1)
    if m.group(0).startswith("["):
        items = [x for part in body.split(",") for x in _range(part, "-", name)]
    elif ".." in body:
        items = _range(body, "..", name)
    else:
        items = body.split(",")
    if not items or not all(items):
        raise ValueError("{!r}: an empty host range".format(name))
    return [h for item in items for h in _expand(name[:m.start()] + item + name[m.end():])]


def _range(part: str, sep: str, name: str) -> List[str]:
    if sep not in part:
        return [part]
    lo, _, hi = part.partition(sep)
    if not (lo.isdigit() and hi.isdigit()) or len(lo) > 9 or len(hi) > 9:
        raise ValueError("{!r}: a range is two numbers, like 01{}64".format(name, sep))
    a, b = int(lo), int(hi)
    if abs(b - a) >= MAX_EXPANDED_HOSTS:
        raise ValueError("{!r}: more than {:,} hosts in one range".format(name, MAX_EXPANDED_HOSTS))
    step = 1 if b >= a else -1
    width = len(lo) if lo.startswith("0") and len(lo) > 1 else 0
    return [str(n).zfill(width) for n in range(a, b + step, step)]


def read_hosts_file(path: str) -> List[str]:
    """One target per line; '#' starts a comment; blank lines are skipped."""
    hosts = []
    with open(path, "r", encoding="utf-8") as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                hosts.append(line)
    return hosts


def port_number(text: str, where: str) -> int:
    """A TCP port, 1–65535: 99999 must not wrap to another port, nor 0 become 22. ValueError says why."""
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise ValueError("{}: port {!r} is not 1–65535".format(where, text))
    return int(text)


def split_target(target: str) -> Tuple[Optional[str], str, Optional[int]]:
    """``user@host[:port]``, ``[v6addr]:port`` or an ssh config alias: (user, host, port), None where not
    typed. Checked before anything is contacted, so a bad port is a usage error, not a failed host."""
    user = None
    rest = target
    if "@" in rest:
        user, rest = rest.rsplit("@", 1)
    if rest.startswith("["):  # [::1]:2222
        host, _, tail = rest[1:].partition("]")
        return user, host, port_number(tail[1:], target) if tail.startswith(":") else None
    if rest.count(":") == 1:  # two or more: a bare IPv6 address, whose port cannot be told apart
        host, _, port = rest.partition(":")
        return user, host, port_number(port, target)
    return user, rest, None

