"""Which paths a root-run command may trust, and writing files where nobody else can point.

``deploy-files`` is run by root and writes what root later copies into ``/etc/cron.d`` and
``/etc/systemd/system``. Another local user must not be able to choose where those bytes land (a link
planted where a file will be written, a folder made first in ``/tmp``), keep write access to them, or
make root trust a file or binary of theirs. The rules are the kernel's own for links
(``fs.protected_symlinks``) and OpenSSH's for its configuration (every directory up to ``/`` owned by
root or the caller and writable by nobody else), applied on file descriptors so that nothing can be
swapped between the check and the write.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from dataclasses import dataclass
from typing import List, Optional, Tuple

from kvforensics.agent.history import fresh_file

# Links followed while walking one path: the kernel's own limit (MAXSYMLINKS).
MAX_LINKS = 40
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


class UntrustedPath(Exception):
    """A path another user could point or write; one sentence that says whose and what to do."""


@dataclass(frozen=True)
class Folder:
    """An open directory checked on its descriptor; ``path`` is where it really is."""

    fd: int
    path: str


def _owner(uid: int) -> str:
    try:
        import pwd

        return "uid {} ({})".format(uid, pwd.getpwuid(uid).pw_name)
    except (ImportError, KeyError):
        return "uid {}".format(uid)


def _trusted_owner(uid: int, euid: int) -> bool:
    return uid in (0, euid)


def why_untrusted_dir(st: os.stat_result, path: str, euid: int, last: bool,
                      egid: Optional[int] = None) -> Optional[str]:
    """Why a directory on the way to (or being) the target lets another user in, or None.

    A sticky directory writable by all (``/tmp``) is fine on the way: others cannot rename or remove
    what root or the caller owns in it. As the target itself it is not: anyone could add names there."""
    if not _trusted_owner(st.st_uid, euid):
        return "{} belongs to {}".format(path, _owner(st.st_uid))
    mode = st.st_mode
    shared = last or not mode & stat.S_ISVTX
    if mode & stat.S_IWOTH and shared:
        return "{} is writable by every user (mode {:o})".format(path, stat.S_IMODE(mode))
    if mode & stat.S_IWGRP and shared and st.st_gid not in (0, os.getegid() if egid is None else egid):
        return "{} is writable by group {} (mode {:o})".format(path, st.st_gid, stat.S_IMODE(mode))
    return None


def _components(path: str) -> List[str]:
    return [part for part in path.split("/") if part and part != "."]


def open_folder(path: str, create: bool = True) -> Folder:
    """Open ``path`` as a directory nobody but root and the caller can write, walking it one component at a
    time on descriptors; missing components are made (0755) when ``create``. A link on the way is followed
    only when root or the caller owns it. Raises UntrustedPath, or OSError for what the system refused."""
    euid = os.geteuid()
    pending = _components(os.path.abspath(path))
    stack: List[Tuple[int, str]] = [(os.open("/", _DIR_FLAGS), "/")]
    links = 0
    try:
        while pending:
            name = pending.pop(0)
            if name == "..":
                if len(stack) > 1:
                    os.close(stack.pop()[0])
                continue
            parent, parent_path = stack[-1]
            _check(parent, parent_path, euid, last=False)  # on the way: before anything in it is read
            here = os.path.join(parent_path, name)
            target = _link_target(parent, name, here, euid)
            if target is not None:
                links += 1
                if links > MAX_LINKS:
                    raise UntrustedPath("{}: too many levels of links".format(path))
                if target.startswith("/"):
                    while len(stack) > 1:
                        os.close(stack.pop()[0])
                pending[:0] = _components(target)
                continue
            stack.append((_open_or_make(parent, name, here, create), here))
        _check(stack[-1][0], stack[-1][1], euid, last=True)  # the target, wherever the walk ended (a ".." too)
        fd, real = stack.pop()
        return Folder(fd, real)
    finally:
        for fd, _ in stack:
            os.close(fd)


def _check(fd: int, path: str, euid: int, last: bool) -> None:
    why = why_untrusted_dir(os.fstat(fd), path, euid, last)
    if why:
        raise UntrustedPath(why)


def _link_target(parent: int, name: str, here: str, euid: int) -> Optional[str]:
    """A link's target when ``name`` is a link root or the caller owns; None when it is not a link."""
    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if not stat.S_ISLNK(st.st_mode):
        return None
    if not _trusted_owner(st.st_uid, euid):
        raise UntrustedPath("{} is a link owned by {}: not followed".format(here, _owner(st.st_uid)))
    return os.readlink(name, dir_fd=parent)


def _open_or_make(parent: int, name: str, here: str, create: bool) -> int:
    """``name`` in ``parent`` opened as a directory, never through a link; made (0755) when missing."""
    try:
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=parent)
        except FileNotFoundError:
            if not create:
                raise
        try:
            os.mkdir(name, 0o755, dir_fd=parent)
        except FileExistsError:
            pass  # made meanwhile by someone: the checks on what we open decide
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UntrustedPath("{} is a link or a file, not a folder: remove it, or write elsewhere".format(
                here)) from None
        raise


def subfolder(folder: Folder, name: str) -> Folder:
    """``name`` inside ``folder``, made if missing; never a link (refused), checked like ``folder``."""
    path = os.path.join(folder.path, name)
    fd = _open_or_make(folder.fd, name, path, create=True)
    try:
        _check(fd, path, os.geteuid(), last=True)
    except BaseException:
        os.close(fd)
        raise
    return Folder(fd, path)


def write_file(folder: Folder, name: str, text: str, mode: int = 0o644) -> str:
    """Write ``name`` inside ``folder``: a fresh file made with O_EXCL beside it, then renamed over the name,
    so a link or another user's file already there is replaced, never written through. Returns its path."""
    fresh_file.replace(".{}.{}.tmp".format(name, secrets.token_hex(6)), name, text.encode("utf-8"), mode,
                       dir_fd=folder.fd)
    return os.path.join(folder.path, name)


def why_untrusted_file(path: str, root: str = "/") -> Optional[str]:
    """Why root should not trust what ``path`` holds (a binary it runs, a settings file it reads), or None:
    it and every folder above it must be root's and writable by no one else. ``root`` is where a test's
    host tree starts; the chain is checked from there (a link is resolved first)."""
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except OSError as exc:
        return "{}: {}".format(path, exc.strerror)
    if st.st_uid != 0 or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return "{} is not root's alone ({}, mode {:o})".format(real, _owner(st.st_uid), stat.S_IMODE(st.st_mode))
    folder = os.path.dirname(real)
    top = os.path.realpath(root)
    while True:
        try:
            st = os.stat(folder)
        except OSError as exc:
            return "{}: {}".format(folder, exc.strerror)
        why = why_untrusted_dir(st, folder, 0, last=False, egid=0)
        if why:
            return why
        if folder in ("/", top):
            return None
        folder = os.path.dirname(folder)
