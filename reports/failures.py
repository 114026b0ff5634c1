"""A target that could not be collected, said in one line of at most 80 columns: ``kvforensics: HOST: STATUS:``
and the failure in a few words with the one thing to do, as many words as the host's name leaves room for (the
whole message, with fingerprints, key files and ssh-keygen lines, with -v, in the JSON and in --format oneline)."""

from __future__ import annotations

from typing import Tuple

LINE_WIDTH = 80
MIN_ROOM = 24  # a long host name: the reason still gets a few words, and the line runs over 80

# Each failure's words, longest first: the first that fits the room left is said.
_CHANGED = ("host key CHANGED, refused (-v says why and how to fix)", "host key CHANGED (-v: why, the fix)",
            "key CHANGED (-v: why, the fix)")
_JUMP = ("a ProxyJump hop's config trusts any key (-v: which)", "a ProxyJump hop trusts any key (-v)",
         "a jump host trusts any key (-v)")
_UNKNOWN = ("unknown key: check it (-v), then --accept-new-host-keys", "unknown key: -v, --accept-new-host-keys",
            "new key: -v, --accept-new-host-keys")
_PASSPHRASE = ("its key needs a passphrase: ssh-add it, or run on a terminal", "key needs a passphrase: ssh-add it",
               "passphrase needed: ssh-add")
_NO_KEY = ("no key was accepted: choose one with --identity FILE (-v: tried)", "no key accepted: --identity FILE (-v)",
           "no key accepted (-v)")
_NO_PYTHON = ("no python3 there (needed: python3 ≥ 3.8)", "no python3 ≥ 3.8 there")
_NO_POD = ("pod not found (-v: kubectl's words)", "pod not found (-v)")
_RBAC = ("kubectl refused: RBAC needs create pods/exec, get pods/log", "RBAC: grant create pods/exec and get pods/log",
         "refused by RBAC (-v: what it needs)")
_KUBECTL_LATE = ("deadline reached while kubectl ran (--timeout)", "no answer in time (--timeout)")
_BY_CODE = {"probe.python_not_found": _NO_PYTHON, "kubectl.pod_not_found": _NO_POD, "kubectl.forbidden": _RBAC,
            "kubectl.timeout": _KUBECTL_LATE}


def failure_line(host: str, status: str, code: str, message: str) -> str:
    """The line said on stderr for one failed target."""
    head = "kvforensics: {}: {}: ".format(host, status)
    return head + short_reason(status, code, message, max(MIN_ROOM, LINE_WIDTH - len(head)))


def short_reason(status: str, code: str, message: str, room: int) -> str:
    """The failure in at most ``room`` characters, with the one thing to do: the known failures of SSH, kubectl
    and the probe in words of their own, any other message cut at a word."""
    words = _phrases(status, code, message)
    if words:
        return next((w for w in words if len(w) <= room), words[-1])
    one = " ".join(message.split())
    host, sep, rest = one.partition(": ")
    names_a_host = host.startswith("[") or "@" in host or ":" in host or \
        host.replace(".", "").replace("-", "").isalnum()
    if sep and names_a_host and len(one) > room:
        one = rest  # the host is already in the line
    if len(one) <= room:
        return one
    cut = one[:max(room - len(" … (-v)"), 8)]
    return (cut.rsplit(" ", 1)[0] if " " in cut else cut) + " … (-v)"


def _phrases(status: str, code: str, message: str) -> Tuple[str, ...]:
    if code in _BY_CODE:
        return _BY_CODE[code]
    if not code.startswith("ssh."):
        return ()
    if status == "host_key_refused":
        if "CHANGED" in message:
            return _CHANGED
        return _JUMP if "ProxyJump hop" in message else _UNKNOWN
    if status == "auth_failed":
        return _PASSPHRASE if "passphrase" in message else _NO_KEY
    return ()
