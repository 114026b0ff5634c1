"""A command's common invocations parsed without typer: what ``kvforensics analyze LOG --json`` and a cron's
``kvforensics record --prom-file F --quiet`` are run as, every time. Importing typer costs ~25 ms of such a
~0.1 s command (bench/RESULTS.md); typer is still the command line's definition and its voice.

``parse`` reads the parameters a command declares (agent/cli/params.py) and accepts only command lines it
understands exactly: long options with their value (``--name VALUE``, ``--name=VALUE``), flags
(``--json``, ``--color``/``--no-color``), the declared short options alone (``-v``, ``-o FILE``), and
positional arguments, with str, int, float and bool values. Anything else — help, ``--``, an unknown or
abbreviated option, short options run together, a missing or malformed value, a missing or extra
argument — returns None, and typer parses it and says what is wrong in its own words. So an answer here
is one typer would give: tests/test_cli_fastparse.py compares the two over generated command lines of
every command.
"""

from __future__ import annotations

import inspect
import re
import typing
from typing import Any, Callable, Dict, List, Optional, Tuple

from kvforensics.agent.cli.params import Param, declared

__all__ = ["FLOAT_TEXT", "INT_TEXT", "parse"]

# The texts whose value every reader agrees on (click's int(), pydantic's lax mode): digits, a sign, a
# decimal point, an exponent. " 7", "1_000", "0x10", "inf" are left to typer.
INT_TEXT = re.compile(r"[+-]?[0-9]+\Z")
FLOAT_TEXT = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?\Z")

_SCALARS = (str, int, float, bool)
_MALFORMED = object()
# What a declaration may say for this parser to read it: words for the help, and a callback of the value
# alone. Anything else (an environment variable, bounds, a count, a file check...) is typer's to apply.
_UNDERSTOOD = frozenset(("help", "metavar", "show_default", "callback"))

# A declared option's token -> (parameter name, its type, the value a flag sets; None: it takes a value)
Tokens = Dict[str, Tuple[str, type, Optional[bool]]]


def parse(command: Callable[..., Any], args: List[str]) -> Optional[Dict[str, Any]]:
    """The keyword arguments to call ``command`` with for ``args`` (what follows the command's name), or
    None where typer must parse them. Option callbacks run here, as click runs them: on every parameter
    that has one, given or not."""
    declared = _declared(command)
    if declared is None:
        return None
    params, tokens = declared
    values = _read(args, tokens, [(name, base) for name, param, base, _ in params if param.kind == "argument"])
    if values is None:
        return None
    kwargs: Dict[str, Any] = {}
    for name, _, _, default in params:
        if name in values:
            kwargs[name] = values[name]
        elif default is inspect.Parameter.empty:
            return None  # required and not given
        else:
            kwargs[name] = default
    for name, param, _, _ in params:
        callback = param.setting("callback")
        if callback is not None:
            kwargs[name] = callback(kwargs[name])
    return kwargs


def _declared(command: Callable[..., Any]) -> Optional[Tuple[List[Tuple[str, Param, type, Any]], Tokens]]:
    """Each parameter as (name, its Param, its base type, its default), and the option tokens; None when a
    parameter is of a kind this parser does not read."""
    try:
        found = declared(command)
    except Exception:  # noqa: BLE001 - an annotation that does not evaluate: typer will say why
        return None
    params: List[Tuple[str, Param, type, Any]] = []
    tokens: Tokens = {}
    for p, annotation, param in found:
        base = _base(annotation) if param is not None else None
        if param is None or base is None or not _understood(param):
            return None
        params.append((p.name, param, base, p.default))
        if param.kind == "option":
            own = _option_tokens(p.name, param, base)
            if own is None:
                return None
            tokens.update(own)
    arguments = [base for _, param, base, _ in params if param.kind == "argument"]
    if list in arguments[:-1] or bool in arguments:
        return None
    return params, tokens


def _option_tokens(name: str, param: Param, base: type) -> Optional[Tokens]:
    """An option's tokens: ``--flag`` (and ``--no-flag``) for a bool, each name for a value."""
    if not param.decls or base is list:
        return None
    tokens: Tokens = {}
    for decl in param.decls:
        on, slash, off = decl.partition("/")
        if base is bool:
            tokens[on] = (name, base, True)
            if slash:
                tokens[off] = (name, base, False)
        elif slash:
            return None
        else:
            tokens[decl] = (name, base, None)
    return tokens


def _understood(param: Param) -> bool:
    if any(name not in _UNDERSTOOD for name, _ in param.settings):
        return False
    callback = param.setting("callback")
    return callback is None or len(inspect.signature(callback).parameters) == 1


def _base(annotation: Any) -> Optional[type]:
    """str, int, float or bool for T or Optional[T]; list for a list of str (a variadic argument)."""
    if typing.get_origin(annotation) is typing.Union:
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        annotation = members[0] if len(members) == 1 else None
    if annotation in _SCALARS:
        return annotation
    return list if annotation == List[str] else None


def _read(args: List[str], tokens: Tokens, arguments: List[Tuple[str, type]]) -> Optional[Dict[str, Any]]:
    """The values given on the command line, by parameter name (the last of a repeated option); None
    where a token is not one this parser reads."""
    values: Dict[str, Any] = {}
    positional: List[str] = []
    i = 0
    while i < len(args):
        token = args[i]
        i += 1
        if token == "--":
            return None
        if not token.startswith("-") or token == "-":
            positional.append(token)
            continue
        name, eq, inline = token.partition("=") if token.startswith("--") else (token, "", "")
        if name not in tokens:
            return None
        param, base, flag = tokens[name]
        if flag is not None:
            if eq:
                return None  # a flag given a value: typer's error
            values[param] = flag
            continue
        if not eq:
            if i == len(args):
                return None
            inline = args[i]
            i += 1
        value = _value(base, inline)
        if value is _MALFORMED:
            return None
        values[param] = value
    for name, base in arguments:
        if base is list:
            if positional:
                values[name], positional = positional, []
        elif positional:
            values[name] = _value(base, positional.pop(0))
            if values[name] is _MALFORMED:
                return None
    return None if positional else values


def _value(base: type, text: str) -> Any:
    if base is str:
        return text
    if base is int:
        return int(text) if INT_TEXT.match(text) else _MALFORMED
    return float(text) if FLOAT_TEXT.match(text) else _MALFORMED
