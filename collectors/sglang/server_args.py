"""Parse SGLang's ``server_args=`` startup line into a dict of resolved flag values.

SGLang prints the whole ServerArgs once at launch, from the main process:
``server_args=ServerArgs(model_path='…', mem_fraction_static=0.88, …)`` (dataclass repr,
0.2.0–0.5.18, ``entrypoints/engine.py``) and ``server_args={'model_path': '…', …}`` (dict of
resolved values, 0.5.19+). Values are Python literals, except a few reprs that are not
(enums such as ``<LoadFormat.AUTO: 'auto'>``, objects); those are kept as their source text so
one odd field never loses the others.
"""

from __future__ import annotations

import ast
from typing import Any, Dict, List, Optional, Tuple

_OPEN = "([{<"
_CLOSE = ")]}>"


def parse_server_args(text: str) -> Optional[Dict[str, Any]]:
    """Return the fields of a ``ServerArgs(...)`` repr or a ``{...}`` dict text, or None.

    ``text`` is what follows ``server_args=``. Returns None when it is neither form.
    """
    text = text.strip()
    if text.startswith("ServerArgs(") and text.endswith(")"):
        return _pairs_to_dict(_split_top_level(text[len("ServerArgs(") : -1]), "=")
    if text.startswith("{") and text.endswith("}"):
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return _pairs_to_dict(_split_top_level(text[1:-1]), ":")
        if isinstance(value, dict):
            return {str(k): v for k, v in value.items()}
    return None


def _split_top_level(body: str) -> List[str]:
    """Split on commas that are outside quotes and brackets."""
    parts: List[str] = []
    depth = 0
    quote = ""
    start = 0
    i = 0
    while i < len(body):
        ch = body[i]
        if quote:
            if ch == "\\":
                i += 2
                continue
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth = max(0, depth - 1)
        elif ch == "," and depth == 0:
            parts.append(body[start:i])
            start = i + 1
        i += 1
    tail = body[start:]
    if tail.strip():
        parts.append(tail)
    return parts


def _pairs_to_dict(parts: List[str], sep: str) -> Optional[Dict[str, Any]]:
    out: Dict[str, Any] = {}
    for part in parts:
        key, value = _split_pair(part, sep)
        if key is None:
            continue
        out[key] = _literal(value)
    return out or None


def _split_pair(part: str, sep: str) -> Tuple[Optional[str], str]:
    idx = part.find(sep)
    if idx <= 0:
        return None, ""
    key = part[:idx].strip().strip("'\"")
    if not key.replace("_", "").isalnum():
        return None, ""
    return key, part[idx + 1 :].strip()


def _literal(value: str) -> Any:
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        return value
