"""The values ``deploy-files`` writes into a cron line, a systemd unit and YAML: checked, then quoted for
the reader of each file, so that no value can add a line, split an argument or expand into something else.

- cron (crontab(5), Debian's cron and cronie alike): the command goes to ``/bin/sh``; an unescaped ``%``
  ends the command and becomes standard input, ``\\%`` is a literal ``%``.
- systemd (systemd.service(5) "Command lines", systemd.unit(5) "Specifiers"): words are split on blanks and
  unquoted; ``%`` starts a specifier (``%%`` is one ``%``) in every setting; ``$`` expands a variable in
  ``ExecStart=`` only (``$$`` is one ``$``).
- An image reference: the grammar of the distribution project's reference package (what docker, podman
  and the kubelet parse), matched whole, so the YAML scalar needs no quoting.
"""

from __future__ import annotations

import re
import shlex
import unicodedata

MAX_PATH = 4096  # PATH_MAX
MAX_IMAGE = 255 + 1 + 128 + 1 + 71 + 64  # name, tag, a sha512 digest

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = r"(?:{0}(?:\.{0})*|\[[0-9a-fA-F:]+\])(?::[0-9]+)?".format(_DOMAIN_PART)
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
IMAGE = re.compile(r"(?:{d}/)?{c}(?:/{c})*(?::{t})?(?:@{g})?".format(d=_DOMAIN, c=_COMPONENT, t=_TAG, g=_DIGEST),
                   re.ASCII)
# What needs no quoting in a systemd word or a shell word.
_PLAIN = re.compile(r"[A-Za-z0-9_./:@+=,-]+", re.ASCII)


class BadValue(ValueError):
    """A value that cannot be written safely; one sentence naming the option."""


def printable(text: str) -> str:
    """``text`` with control and line-separator characters shown escaped: for messages about hostile values."""
    return "".join(ch if not _is_control(ch) else ch.encode("unicode_escape").decode("ascii") for ch in text)


def _is_control(ch: str) -> bool:
    return unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp")


def absolute_path(value: str, what: str) -> str:
    """``value`` if it is an absolute path of printable characters (normalised: no ``//``, ``.``, trailing
    ``/``); else BadValue. Relative paths are refused, not resolved: cron and systemd run from ``/``."""
    if not value or len(value) > MAX_PATH:
        raise BadValue("{} must be an absolute path of at most {} characters".format(what, MAX_PATH))
    if any(_is_control(ch) for ch in value):
        raise BadValue("{} {!r} holds a control character (a newline would add a line)".format(
            what, printable(value)))
    if not value.startswith("/"):
        raise BadValue("{} {} is relative: cron and systemd run from /, give an absolute path".format(
            what, printable(value)))
    normal = re.sub(r"/+", "/", value)
    parts = [p for p in normal.split("/") if p not in ("", ".")]
    return "/" + "/".join(parts)


def image_reference(value: str) -> str:
    if len(value) > MAX_IMAGE or not IMAGE.fullmatch(value):
        raise BadValue("--image {!r} is not an image reference ([REGISTRY[:PORT]/]NAME[:TAG][@DIGEST], lower-case "
                       "name)".format(printable(value[:300])))
    return value


def cron_word(value: str) -> str:
    """One shell word of a cron command: quoted for /bin/sh, ``%`` escaped for cron."""
    word = value if _PLAIN.fullmatch(value) else shlex.quote(value)
    return word.replace("%", "\\%")


def systemd_word(value: str, in_exec: bool) -> str:
    """One word of a systemd setting: double-quoted when it holds anything but plain characters, ``%`` as
    ``%%`` and, in ``ExecStart=``, ``$`` as ``$$``."""
    text = value.replace("%", "%%")
    if in_exec:
        text = text.replace("$", "$$")
    if _PLAIN.fullmatch(value):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
