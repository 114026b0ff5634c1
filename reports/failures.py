"""A target that could not be collected, said in one short line: its status and the one thing to do, about 80
columns with a short host name (the whole message, with fingerprints, key files and ssh-keygen lines, with -v, in
the JSON and in --format oneline)."""

from __future__ import annotations

SHORT_WIDTH = 56  # what is left of 80 columns after "kvforensics: ", a host name and a status


def short_reason(status: str, code: str, message: str) -> str:
    """The failure in a few words, with the one thing to do (an SSH host's or the probe's; kubectl's messages are
    one short line already)."""
    if not code.startswith(("ssh.", "probe.")):
        return " ".join(message.split())
    if status == "host_key_refused":
        if "CHANGED" in message:
            return "host key CHANGED, refused (-v says why and how to fix)"
        if "ProxyJump hop" in message:
            return "a ProxyJump hop's config trusts any key (-v: which)"
        return "unknown key: check it (-v), --accept-new-host-keys"
    if status == "auth_failed":
        if "passphrase" in message:
            return "its key needs a passphrase: ssh-add it, or run on a terminal"
        return "no key was accepted: choose one with --identity FILE (-v: tried)"
    if code == "probe.python_not_found":
        return "no python3 there (needed: python3 ≥ 3.8)"
    one = " ".join(message.split())
    host, sep, rest = one.partition(": ")
    names_a_host = host.startswith("[") or "@" in host or ":" in host or \
        host.replace(".", "").replace("-", "").isalnum()
    if sep and names_a_host and len(one) > SHORT_WIDTH:
        one = rest  # the host is already in the line
    return one if len(one) <= SHORT_WIDTH + 24 else one[:SHORT_WIDTH + 21].rsplit(" ", 1)[0] + " … (-v)"
