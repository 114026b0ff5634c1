"""Keep secrets out of everything kvforensics stores or prints.

SGLang takes ``--api-key``/``--admin-api-key`` on its command line and echoes them in
``server_args=`` and ``/server_info``; Hugging Face tokens can appear in env-style flags. Values
of such keys become ``"<redacted>"`` at collection time, so no snapshot, bundle or report holds them.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List

REDACTED = "<redacted>"
_SECRET = re.compile(r"(api_key|api-key|token|secret|password|passwd|credential|auth)", re.I)
# token-*counting* fields are not secrets
_NOT_SECRET = re.compile(r"(tokens|tokenizer|_token_|max_.*token|num_.*token|token_usage|token_ids)", re.I)


def is_secret(key: str) -> bool:
    return bool(_SECRET.search(key)) and not _NOT_SECRET.search(key)


def redact_mapping(data: Any) -> Any:
    """A copy of a (nested) mapping with secret values replaced."""
    if isinstance(data, dict):
        out: Dict[str, Any] = {}
        for key, value in data.items():
            # any type: a numeric --api-key 123456 parses as an int, vLLM's api_key is a list of strings
            if is_secret(str(key)) and value not in (None, "", False, [], True):
                out[key] = REDACTED
            else:
                out[key] = redact_mapping(value)
        return out
    if isinstance(data, list):
        return [redact_mapping(v) for v in data]
    return data


# key='value' (ServerArgs repr), 'key': 'value' (dict form) and 'key': ['v1', 'v2'] (vLLM's api_key is a
# list since 0.10) inside a raw log line
_ASSIGNED = re.compile(r"""(?P<key>['"]?[A-Za-z_][\w-]*['"]?)(?P<sep>\s*[=:]\s*)"""
                       r"""(?P<value>'[^']*'|"[^"]*"|\[[^\]]*\])""")


def redact_text(line: str) -> str:
    """A log line with the quoted values of secret keys replaced (``api_key='sk-…'``)."""
    def swap(m: "re.Match[str]") -> str:
        key = m.group("key").strip("'\"")
        if not is_secret(key) or m.group("value") in ("''", '""', "[]"):
            return m.group(0)
        return m.group("key") + m.group("sep") + "'" + REDACTED + "'"

    return _ASSIGNED.sub(swap, line)


def redact_argv(argv: List[str]) -> List[str]:
    """``--api-key X`` and ``--api-key=X`` keep the option, lose the value."""
    out: List[str] = []
    hide_next = False
    for token in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        name, eq, _ = token.partition("=")
        if token.startswith("--") and is_secret(name):
            if eq:
                out.append(name + "=" + REDACTED)
            else:
                out.append(token)
                hide_next = True
            continue
        out.append(token)
    return out
