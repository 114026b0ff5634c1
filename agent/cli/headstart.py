"""A one-host ``inspect``'s ssh, started before typer is imported: the head start.

``kvforensics inspect HOST`` spent ~90 ms importing typer and reading its command line before its ssh started
(bench/RESULTS.md, 2026-12-03), and the ssh handshake after it (~350 ms on loopback) waits mostly on the network:
the one host an on-call engineer waits for paid both in a row. So before typer is imported, the command line is
read here in the simplest way that can be right: inspect's own declared options (agent/cli/params.py), each
taking a value or not, and one SSH target. What this finds is a guess, never a decision: typer still reads the
command line and the command still checks it, and the ssh started here is used only when the one the run then
asks for has the same target, the same options and the same argv (agent/remote/openssh.py, head_start and
connect). Otherwise it is ended, as it is when the command line is refused or the run stops.

Anything unusual and nothing starts: another command, --help, an option this does not know or a short one
with its value attached, ``--``, no target or more than one, a range, a pod, this machine, --hosts-file,
--from, paramiko, or --accept-new-host-keys (which writes known_hosts: not before the command line is checked).
"""

from __future__ import annotations

import os
import sys
from typing import Dict, List, NamedTuple, Optional, Tuple

from kvforensics.agent.cli.params import declared

__all__ = ["Guess", "begin", "end", "guess"]


class Guess(NamedTuple):
    """What the run will most likely ask ssh for: one target and how to reach it."""

    target: str
    ssh_config: Optional[str]
    identity: Optional[str]
    multiplex: bool
    timeout_s: float


def begin(args: List[str]) -> None:
    """Start the one SSH target's ssh now, when the command line makes it plain; never raises (a guess that
    fails leaves the run as it would have been)."""
    try:
        found = guess(args)
        if found is None:
            return
        from kvforensics.agent.remote import openssh

        openssh.head_start(found.target, openssh.Options(ssh_config=found.ssh_config, identity=found.identity,
                                                         multiplex=found.multiplex,
                                                         interactive=sys.stdin.isatty()), found.timeout_s)
    except Exception:  # noqa: BLE001 - the run itself reports whatever is wrong, in its own words
        return


def end() -> None:
    """The head start's ssh ended if the run did not take it (refused command line, Ctrl-C, another target)."""
    openssh = sys.modules.get("kvforensics.agent.remote.openssh")
    if openssh is not None:
        openssh.drop_head()


def guess(args: List[str]) -> Optional[Guess]:
    """The SSH target and the options that shape its ssh, or None where anything is unusual (the module's
    docstring)."""
    if len(args) < 2 or args[0] != "inspect" or any(k.startswith("_") and k.endswith("_COMPLETE")
                                                    for k in os.environ):
        return None
    options = _declared_options()
    read = _read(args[1:], options)
    if read is None:
        return None
    given, targets = read
    values = dict(options.defaults, **given)
    if len(targets) != 1 or any(values.get(k) for k in ("hosts_file", "from_file", "accept_new_host_keys")):
        return None
    target, identity, ssh_config = targets[0], values.get("identity"), values.get("ssh_config")
    timeout = _seconds(values["timeout"])
    if values["transport"] not in ("auto", "openssh") or not _one_ssh_host(target) or timeout is None:
        return None
    if identity is not None and not os.path.isfile(os.path.expanduser(str(identity))):
        return None  # the command refuses it (--identity: no such key file)
    return Guess(target, None if ssh_config is None else str(ssh_config), None if identity is None else str(identity),
                 values["multiplex"] is True, timeout)


class _Options(NamedTuple):
    """inspect's declared options: the flags (name -> parameter, the value it sets), those taking a value (name
    -> parameter), and every parameter's default."""

    flags: Dict[str, Tuple[str, bool]]
    valued: Dict[str, str]
    defaults: Dict[str, object]


def _declared_options() -> _Options:
    from kvforensics.agent.cli.inspect import inspect

    made = _Options({}, {}, {})
    for p, annotation, param in declared(inspect):
        made.defaults[p.name] = p.default
        if param is None or param.kind != "option":
            continue
        for decl in param.decls:
            if annotation in (bool, Optional[bool]):
                on, _, off = decl.partition("/")
                made.flags[on] = (p.name, True)
                if off:
                    made.flags[off] = (p.name, False)
            else:
                made.valued[decl] = p.name
    return made


def _read(tokens: List[str], options: _Options) -> Optional[Tuple[Dict[str, object], List[str]]]:
    """(option values by parameter name, the arguments) as click would read ``tokens``, or None."""
    values: Dict[str, object] = {}
    targets: List[str] = []
    rest = iter(tokens)
    for token in rest:
        if not token.startswith("-") or token == "-":
            targets.append(token)
            continue
        name, eq, value = token.partition("=") if token.startswith("--") else (token, "", "")
        if name in options.flags and not eq:
            values[options.flags[name][0]] = options.flags[name][1]
        elif name in options.valued:
            taken = value if eq else next(rest, None)
            if taken is None:
                return None
            values[options.valued[name]] = taken
        else:  # --help, --version, "--", -ikey, a typo: typer's to say
            return None
    return values, targets


def _one_ssh_host(target: str) -> bool:
    from kvforensics.agent.cli.inspect import LOCAL_NAMES
    from kvforensics.agent.remote.targets import expand_targets, split_target

    if target in LOCAL_NAMES or target.startswith("k8s:"):
        return False
    try:
        split_target(target)
        return expand_targets([target]) == [target]
    except ValueError:
        return False


def _seconds(value: object) -> Optional[float]:
    """--timeout as the command reads it (agent/cli/__init__.py's FLOAT_TEXT; the default is a float), when the
    command accepts it; else None."""
    from kvforensics.agent.cli import FLOAT_TEXT
    from kvforensics.agent.cli.inspect import timeout_accepted

    if isinstance(value, str):
        if not FLOAT_TEXT.match(value):
            return None
        value = float(value)
    if not isinstance(value, float):
        return None
    return value if timeout_accepted(value) else None
