"""Read an engine's flags from its command line the way its argparse would: ``--flag value``,
``--flag=value``, switches that take no value, one positional (the model of ``… serve MODEL``).

Engine-neutral: each engine's ``processes`` module says how an option spelling resolves to its
destination name (aliases, unique prefixes, ``_`` for ``-``) and which options are switches.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional


def value_of(text: str) -> Any:
    """An argument as argparse's ``type=`` would usually leave it: int, float, bool, None or text."""
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    if text in ("True", "true"):
        return True
    if text in ("False", "false"):
        return False
    if text in ("None", "null"):
        return None
    return text


def _takes_value(token: str) -> bool:
    """Whether the token after an option is its value: not another option (negative numbers are values)."""
    if not token.startswith("-"):
        return True
    try:
        float(token)
        return True
    except ValueError:
        return False


def parse_flags(argv: List[str], resolve: Callable[[str], Optional[str]], is_switch: Callable[[str], bool],
                positional: Optional[str] = None) -> Dict[str, Any]:
    """``{dest: value}`` from ``argv`` (everything after the launch form).

    ``resolve(option)`` -> dest name (or None: not an option of this engine, e.g. ``-``);
    ``is_switch(option)`` -> the option takes no value (``--no-X`` sets X False: BooleanOptionalAction);
    ``positional``: the dest of a leading positional argument (the model of ``vllm serve MODEL``)."""
    args: Dict[str, Any] = {}
    i = 0
    while i < len(argv):
        token = argv[i]
        name, eq, inline = token.partition("=")
        dest = resolve(name) if token.startswith("-") and len(token) > 1 else None
        if dest is None:
            if positional and i == 0 and positional not in args:
                args[positional] = token
            i += 1
            continue
        if eq:
            args[dest] = value_of(inline)
        elif is_switch(name):
            negated = name.startswith("--no-")
            args[dest] = not negated
        elif i + 1 < len(argv) and _takes_value(argv[i + 1]):
            args[dest] = value_of(argv[i + 1])
            i += 1
        else:
            args[dest] = True
        i += 1
    return args
