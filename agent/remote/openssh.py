"""SSH to inspected hosts with the system's OpenSSH client: what ``ssh HOST`` honours, kvforensics honours.

The ssh config (``~/.ssh/config``, ``/etc/ssh/ssh_config``, or ``--ssh-config``) is read by ssh itself:
ProxyCommand and ProxyJump (AWS SSM, GCP IAP, Teleport, Cloudflare), ``Match exec``, ``Include``,
CertificateFile, IdentityAgent, hardware keys, GSSAPI, CanonicalizeHostname. kvforensics adds, on the command
line (where an option wins over the config):

* the host-key policy: ``StrictHostKeyChecking yes``, or ``accept-new`` with ``--accept-new-host-keys`` or where
  the config says ``accept-new`` (or ``no``, which is read as accept-new: a changed key is always refused, and a
  new one recorded, never trusted silently). What the config says is asked of ssh itself (``ssh -G``, which
  evaluates Match and Include as the connection will);
* ``BatchMode yes`` unless one host is inspected from a terminal (a passphrase or a hardware key's touch is then
  asked by ssh, on the terminal); no agent or X11 forwarding, no tty;
* multiplexing: ``ControlMaster auto`` with a ``ControlPath`` in a private folder of ours and ``ControlPersist``
  a minute, so a second look at a host, or a sweep after a sweep, pays one exec round trip (``--no-multiplex``
  turns it off);
* ``-v``: ssh's debug lines give the host key's fingerprint and the keys tried, for one-line reasons; they are
  parsed, never shown.

The probe goes on stdin to the fixed remote command; ssh gets an argv list (no local shell), the destination after
``--``. Each host has a deadline (its process group is killed there) and output caps. Statuses come from ssh's
exit code (255: ssh's own failure) and its words on stderr.
"""

from __future__ import annotations

import os
import re
import selectors
import signal
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, NamedTuple, Optional, Set, Tuple

from kvforensics.agent.remote.outcome import MAX_STDERR_BYTES, MAX_STDOUT_BYTES, ExecResult, SshError
from kvforensics.agent.remote.stopping import OWN_PROCESS_GROUP, kill_group
from kvforensics.agent.remote.targets import split_target
from kvforensics.collectors.probe import REMOTE_COMMAND, sha256_hex

MIN_VERSION = (7, 6)  # StrictHostKeyChecking accept-new
CONTROL_PERSIST_S = 60
CONTROL_DIR_ENV = "KVFORENSICS_SSH_CONTROL_DIR"
_VERSION = re.compile(r"OpenSSH_(\d+)\.(\d+)")
# A name or alias (never starting with "-": it would be an option), or an IPv6 literal ("::1", "fe80::1%eth0").
_DESTINATION = re.compile(r"^(?:[A-Za-z0-9_][A-Za-z0-9_.%:+-]{0,252}|[0-9A-Fa-f:.]{2,45}(?:%[\w.-]{1,32})?)\Z")
_SSH_ERROR = 255
_DEBUG = re.compile(rb"^debug\d: ")


@dataclass(frozen=True)
class Client:
    """The OpenSSH client found on PATH."""

    path: str
    version: Tuple[int, int]
    banner: str


_FOUND: Dict[str, Optional[Client]] = {}


def find_client() -> Optional[Client]:
    """The ``ssh`` on PATH when it is OpenSSH ≥ 7.6 (``ssh -V``), else None; asked once per process, and its
    banner kept in the user's cache for that binary (path, size, mtime, inode): ~10 ms of every one-host
    inspect, before the handshake could start."""
    if "ssh" in _FOUND:
        return _FOUND["ssh"]
    client = None
    path = _on_path("ssh")
    if path is not None:
        banner = _banner(path)
        m = _VERSION.search(banner)
        if m and (int(m.group(1)), int(m.group(2))) >= MIN_VERSION:
            client = Client(path, (int(m.group(1)), int(m.group(2))), banner[:120])
    _FOUND["ssh"] = client
    return client


def _on_path(name: str) -> Optional[str]:
    """``shutil.which(name)`` without shutil, whose import (bz2, lzma, fnmatch) cost a one-host inspect ~7 ms
    before its ssh could start; and never from a relative PATH entry ("", "."), which would run an ``ssh`` from
    wherever the command was typed."""
    for folder in os.environ.get("PATH", os.defpath).split(os.pathsep):
        path = os.path.join(folder, name)
        if os.path.isabs(folder) and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def _banner(path: str) -> str:
    """The first line ``ssh -V`` prints, from the cache when the binary is the one it was read from."""
    from kvforensics.agent.remote import usercache

    try:
        st = os.stat(path)
    except OSError:
        return ""
    seen = "{}\0{}\0{}\0{}".format(os.path.realpath(path), st.st_size, st.st_mtime_ns, st.st_ino)
    kept = os.path.join(usercache.folder(), "ssh-{}".format(sha256_hex(seen.encode("utf-8", "replace"))[:32]))
    try:
        with open(kept, encoding="utf-8") as f:
            said = f.read(400).strip()
        if _VERSION.search(said):
            return said
    except (OSError, UnicodeDecodeError):
        pass
    try:
        done = subprocess.run([path, "-V"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ""
    lines = (done.stderr or done.stdout).decode("utf-8", "replace").strip().splitlines()[:1]
    said = lines[0][:200] if lines else ""
    if _VERSION.search(said):
        usercache.keep(kept, (said + "\n").encode("utf-8"))
    return said


def control_dir() -> Tuple[Optional[str], str]:
    """(a private folder for master sockets, "") or (None, why multiplexing is off): ours alone (mode 0700,
    our uid, not a link), under $XDG_RUNTIME_DIR or /tmp, or where KVFORENSICS_SSH_CONTROL_DIR says."""
    where = os.environ.get(CONTROL_DIR_ENV)
    if not where:
        runtime = os.environ.get("XDG_RUNTIME_DIR")
        base = runtime if runtime and os.path.isdir(runtime) else "/tmp"
        where = os.path.join(base, "kvforensics-ssh-{}".format(os.getuid()))
    try:
        os.mkdir(where, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        return None, "cannot make {} ({})".format(where, exc.strerror or exc)
    st = os.lstat(where)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None, "{} is not a folder of ours alone (mode 0700)".format(where)
    # A unix socket path holds at most 107 bytes: the folder, "/", a 32-hex-digit name, and the 17 characters
    # ssh appends to a master's temporary socket while it sets it up.
    if len(where) > 60:
        return None, "{} is too long a path for ssh's control sockets".format(where)
    return where, ""


@dataclass
class Options:
    """How this run reaches hosts with OpenSSH."""

    ssh_config: Optional[str] = None
    accept_new: bool = False
    identity: Optional[str] = None
    multiplex: bool = True
    interactive: bool = False  # one host from a terminal: ssh may ask for a passphrase there


class Sessions(object):
    """The ssh processes one transport has running, so that a sweep that stops (Ctrl-C) ends them at once rather
    than leave them to finish a probe nobody waits for; once abandoned, it starts no more."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: Set[subprocess.Popen] = set()  # type: ignore[type-arg]
        self._abandoned = False

    def start(self, argv: List[str], on_terminal: bool = False) -> subprocess.Popen:  # type: ignore[type-arg]
        """ssh on pipes, in a process group of its own; ``on_terminal``, in ours, as a typed ``ssh`` runs: a
        passphrase is read from the terminal, which stops (SIGTTOU) a process outside its foreground group."""
        with self._lock:
            if self._abandoned:
                raise SshError("error", "the sweep was stopped before this host's ssh started")
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    close_fds=True, **({} if on_terminal else OWN_PROCESS_GROUP))
            self._live.add(proc)
            return proc

    def adopt(self, proc: subprocess.Popen) -> None:  # type: ignore[type-arg]
        """A head start's ssh (head_start), from now on one of these."""
        with self._lock:
            self._live.add(proc)
            if self._abandoned:
                kill_group(proc, signal.SIGTERM)

    def ended(self, proc: subprocess.Popen) -> None:  # type: ignore[type-arg]
        with self._lock:
            self._live.discard(proc)

    def abandon(self) -> None:
        """SIGTERM to every live ssh's process group (ssh and its ProxyCommand): ssh closes its channel, and sshd
        hangs up the probe's session. Then each is waited for, up to 2 s in all, and killed past that: the run
        exits next, and must not leave one behind (under load one was still running as it exited)."""
        with self._lock:
            self._abandoned = True
            live = list(self._live)
        for proc in live:
            kill_group(proc, signal.SIGTERM)
        until = time.monotonic() + 2.0
        for proc in live:
            try:
                proc.wait(timeout=max(0.0, until - time.monotonic()))
            except subprocess.TimeoutExpired:
                kill_group(proc)
                proc.wait()


@dataclass
class Connection:
    """One host through ssh: its argv (without the remote command) and what ssh said about it."""

    client: Client
    target: str
    destination: List[str]  # ["-l", user, "-p", port, "--", host]
    settings: Dict[str, str]  # ``ssh -G`` of the destination
    options: Options
    sessions: Sessions  # the transport's: what a stopped sweep ends
    fingerprint: str = ""  # of everything ssh -G resolved: which master connection this destination may share
    connect_timeout: int = 0  # the ConnectTimeout the last ssh ran with
    notes: List[str] = field(default_factory=list)
    head: Optional["_Head"] = None  # an ssh started for this destination before the run asked (head_start)

    @property
    def name(self) -> str:
        """How OpenSSH names the host in known_hosts."""
        host = self.settings.get("hostkeyalias") or self.settings.get("hostname", "?")
        port = self.settings.get("port", "22")
        return host if port == "22" else "[{}]:{}".format(host, port)

    def strictness(self) -> str:
        said = self.settings.get("stricthostkeychecking", "true").lower()
        if self.options.accept_new or said in ("accept-new", "false", "no", "off"):
            return "accept-new"
        return "yes"

    def argv(self, command: str, deadline: float) -> List[str]:
        # ssh's own timeout a second before the deadline: a silent port is then ssh's "no handshake", said the
        # same way whatever --timeout is, and the deadline is left for a probe that runs too long.
        left = max(1, int(deadline - time.monotonic()) - 1)
        configured = self.settings.get("connecttimeout", "none")
        timeout = min(left, int(configured)) if configured.isdigit() and int(configured) > 0 else left
        self.connect_timeout = timeout
        alive = self.settings.get("serveraliveinterval", "0")
        args = [self.client.path, "-v", "-T", "-a", "-x", "-o", "BatchMode={}".format(
            "no" if self.options.interactive else "yes"),
            "-o", "StrictHostKeyChecking={}".format(self.strictness()), "-o", "ConnectTimeout={}".format(timeout),
            "-o", "ServerAliveInterval={}".format(alive if alive.isdigit() and alive != "0" else 15),
            "-o", "ServerAliveCountMax=3", "-o", "EscapeChar=none"]
        args += self._control()
        if self.options.ssh_config:
            args += ["-F", self.options.ssh_config]
        if self.options.identity:
            args += ["-i", self.options.identity]
        return args + self.destination + [command]

    def _control(self) -> List[str]:
        if not self.options.multiplex:
            return ["-o", "ControlMaster=no", "-o", "ControlPath=none"]
        folder, why = control_dir()
        if folder is None:
            if why not in self.notes:
                self.notes.append("no shared SSH connection: " + why)
            return ["-o", "ControlMaster=no", "-o", "ControlPath=none"]
        # Not %C (local host, host, port, user): two aliases of one host with other known_hosts files, keys or
        # proxies must not share a master, or one would skip the host-key check the other asks for.
        return ["-o", "ControlMaster=auto", "-o", "ControlPath={}/{}".format(folder, self.fingerprint),
                "-o", "ControlPersist={}".format(CONTROL_PERSIST_S)]

    def exec(self, command: str, stdin: bytes, deadline: float) -> ExecResult:
        argv = self.argv(command, deadline)
        out, err, status = _run(self.sessions, argv, stdin, deadline, self.options.interactive, self._take_head(argv))
        ssh_lines, remote = _split_stderr(err)
        if status == _SSH_ERROR:
            raise _failure(self, ssh_lines, err)
        self.notes.extend(_notes(self, ssh_lines))
        return ExecResult(status, out, remote, len(stdin))

    def close(self) -> None:
        """A head start not used is ended; nothing else to close: a shared master lives on for ControlPersist,
        then exits by itself."""
        self._take_head(None)

    def _take_head(self, argv: Optional[List[str]]) -> "Optional[subprocess.Popen[bytes]]":
        """The head start's ssh, once, when it was started with ``argv`` (ConnectTimeout aside); else it is
        ended."""
        head, self.head = self.head, None
        if head is None:
            return None
        if argv is not None and _same_ssh(head.argv, argv):
            self.connect_timeout = head.connect_timeout  # the one that ssh runs with
            return head.proc
        _end(head.proc)
        self.sessions.ended(head.proc)
        return None


def connect(target: str, options: Options, deadline: float, sessions: Optional[Sessions] = None) -> Connection:
    """The destination checked and resolved by ssh itself (``ssh -G``); nothing is sent to the host yet."""
    head = _claim_head(target, options)
    if head is not None:
        head.conn.sessions = sessions or Sessions()
        head.conn.sessions.adopt(head.proc)
        head.conn.head = head
        return head.conn  # what ssh -G said, asked once
    client = find_client()
    if client is None:
        raise SshError("error", "no OpenSSH client ≥ 7.6 on PATH (use --transport paramiko)")
    try:
        user, host, port = split_target(target)
    except ValueError as exc:
        raise SshError("error", str(exc)) from None
    if not host or not _DESTINATION.match(host):
        raise SshError("error", "{!r} is not a host".format(target))
    destination = (["-l", user] if user else []) + (["-p", str(port)] if port else []) + ["--", host]
    settings, resolved = _settings(client, options, destination, target, deadline)
    _check_jumps(client, options, settings, target, deadline)
    conn = Connection(client, target, destination, settings, options, sessions or Sessions())
    seen = "\0".join((resolved, conn.strictness(), options.identity or "", str(options.interactive)))
    conn.fingerprint = sha256_hex(seen.encode("utf-8", "replace"))[:32]
    return conn


class _Head(NamedTuple):
    """One destination's ssh, started before the run asked for it (agent/cli/headstart.py): the probe's remote
    command waiting for its stdin."""

    conn: Connection  # its target, options and what ssh -G said
    argv: List[str]
    connect_timeout: int  # the argv's
    proc: "subprocess.Popen[bytes]"


_HEAD: List[_Head] = []  # at most one
_HEAD_LOCK = threading.Lock()


def head_start(target: str, options: Options, timeout_s: float) -> None:
    """Start ``target``'s ssh for the probe now, as ``connect`` and ``exec`` would: kept for the ``connect`` of
    the same target and options, whose ``exec`` takes it when its argv is this one (else it is ended). What is
    wrong here (ssh -G refuses the config, no client) is left for the run to find and say."""
    if find_client() is None:
        return
    deadline = time.monotonic() + timeout_s
    try:
        conn = connect(target, options, deadline)
    except SshError:
        return
    argv = conn.argv(REMOTE_COMMAND, deadline)
    proc = conn.sessions.start(argv, options.interactive)
    drop_head()  # one at a time
    with _HEAD_LOCK:
        _HEAD.append(_Head(conn, argv, conn.connect_timeout, proc))


def drop_head() -> None:
    """The head start's ssh ended, if no connection took it."""
    with _HEAD_LOCK:
        heads = _HEAD[:]
        del _HEAD[:]
    for head in heads:
        _end(head.proc)


def _claim_head(target: str, options: Options) -> Optional[_Head]:
    with _HEAD_LOCK:
        if _HEAD and _HEAD[0].conn.target == target and _HEAD[0].conn.options == options:
            return _HEAD.pop()
    return None


def _same_ssh(started: List[str], wanted: List[str]) -> bool:
    """The same argv but for ConnectTimeout, which counts down from a deadline taken a little earlier."""
    def plain(argv: List[str]) -> List[str]:
        return [a for a in argv if not a.startswith("ConnectTimeout=")]

    return plain(started) == plain(wanted)


def _end(proc: "subprocess.Popen[bytes]") -> None:
    """SIGTERM first: an ssh asking for a passphrase puts the terminal back as it was (echo on) before it exits."""
    kill_group(proc, signal.SIGTERM)
    try:
        proc.wait(timeout=2)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        proc.wait()
    _close_pipes(proc)


def _close_pipes(proc: "subprocess.Popen[bytes]") -> None:
    for f in (proc.stdin, proc.stdout, proc.stderr):
        if f is not None and not f.closed:
            f.close()


def _check_jumps(client: Client, options: Options, settings: Dict[str, str], target: str, deadline: float) -> None:
    """ssh connects to ProxyJump hops by their own config, where the command line's StrictHostKeyChecking does not
    reach: a hop whose config says ``no`` would be trusted silently, so it is refused, with what to change."""
    jumps = settings.get("proxyjump", "none")
    if jumps.lower() == "none":
        return
    for hop in [j.strip() for j in jumps.split(",") if j.strip()][:8]:
        user, _, rest = hop.rpartition("@")
        host, port = rest, None
        if rest.count(":") == 1:
            host, port = rest.split(":")
        if not _DESTINATION.match(host):
            raise SshError("error", "{}: ProxyJump hop {!r} is not a host".format(target, hop))
        hop_dest = (["-l", user] if user else []) + (["-p", port] if port else []) + ["--", host]
        said, _ = _settings(client, options, hop_dest, target, deadline)
        if said.get("stricthostkeychecking", "true").lower() in ("false", "no", "off"):
            raise SshError("host_key_refused", "{}: the ssh config says StrictHostKeyChecking no for ProxyJump hop "
                           "{}, which ssh would then trust silently; set it to accept-new (or yes) for that "
                           "host".format(target, hop))


def _settings(client: Client, options: Options, destination: List[str], target: str,
              deadline: float) -> Tuple[Dict[str, str], str]:
    """``ssh -G``: the configuration ssh will use for this destination (Match and Include evaluated)."""
    argv = [client.path, "-G"] + (["-F", options.ssh_config] if options.ssh_config else []) + destination
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              timeout=max(1.0, min(30.0, deadline - time.monotonic())), **OWN_PROCESS_GROUP)
    except subprocess.TimeoutExpired:
        raise SshError("error", "{}: ssh -G did not answer (a Match exec command that hangs?)".format(target)) \
            from None
    except OSError as exc:
        raise SshError("error", "{}: cannot run ssh: {}".format(target, exc.strerror or exc)) from None
    if done.returncode != 0:
        said = _last_line(done.stderr) or "exit {}".format(done.returncode)
        raise SshError("error", "{}: the ssh config refuses it: {}".format(target, said))
    text = done.stdout.decode("utf-8", "replace")
    out: Dict[str, str] = {}
    for line in text.splitlines()[:4000]:
        key, _, value = line.partition(" ")
        out.setdefault(key.lower(), value.strip())
    return out, text


def _run(sessions: Sessions, argv: List[str], stdin: bytes, deadline: float, on_terminal: bool = False,
         started: "Optional[subprocess.Popen[bytes]]" = None) -> Tuple[bytes, bytes, int]:
    """Run ssh with ``stdin`` (or feed the one ``started`` with ``argv`` already); (stdout, stderr, exit status).
    Bounded in time (the deadline kills its process group: ssh and its ProxyCommand) and in memory (the caps)."""
    proc = started if started is not None else sessions.start(argv, on_terminal)
    out, err = bytearray(), bytearray()
    sel = selectors.DefaultSelector()
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    for f in (proc.stdin, proc.stdout, proc.stderr):
        os.set_blocking(f.fileno(), False)
    sel.register(proc.stdout, selectors.EVENT_READ, out)
    sel.register(proc.stderr, selectors.EVENT_READ, err)
    pending = memoryview(stdin)
    if pending:
        sel.register(proc.stdin, selectors.EVENT_WRITE, None)
    else:
        proc.stdin.close()
    exited = False
    try:
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                raise SshError("unreachable", "deadline reached while the probe ran")
            # ssh's exit is looked at before the select, never after it: ssh writes its last output, then exits, and
            # a thread may wait for the GIL between a select that timed out and its next line for long enough that
            # ssh did both meanwhile; "nothing came, and ssh is gone", seen in that order, lost 4-16 % of the
            # answers of 128 hosts 64 at a time (bench/RESULTS.md, 2026-12-03). Seen first, the exit means all ssh
            # wrote is in the pipes when the select starts, and the select finds it.
            exited = exited or proc.poll() is not None
            if exited:
                # read what is buffered, then stop at the first quiet moment rather than wait for EOF: a shared
                # master this ssh started may hold a copy of the pipes for as long as it persists
                left = min(left, 0.2)
            events = sel.select(timeout=min(left, 0.5))
            if not events and exited:
                break
            for key, _ in events:
                if key.fileobj is proc.stdin:
                    pending = _write(proc, sel, pending)
                else:
                    _read(sel, key, out, err)
        status = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        return bytes(out), bytes(err), status
    except subprocess.TimeoutExpired:
        raise SshError("unreachable", "deadline reached while the probe ran") from None
    finally:
        sel.close()
        if proc.poll() is None:
            kill_group(proc)
            proc.wait()
        sessions.ended(proc)
        _close_pipes(proc)


def _read(sel: selectors.BaseSelector, key: selectors.SelectorKey, out: bytearray, err: bytearray) -> None:
    """What one of ssh's outputs has now, into its buffer; past a cap the host is refused."""
    chunk = os.read(key.fd, 1 << 16)
    if not chunk:
        sel.unregister(key.fileobj)
        return
    key.data.extend(chunk)
    if len(out) > MAX_STDOUT_BYTES or len(err) > MAX_STDERR_BYTES:
        raise SshError("error", "the host printed more than {} MiB: not a kvforensics probe answer".format(
            (MAX_STDOUT_BYTES if len(out) > MAX_STDOUT_BYTES else MAX_STDERR_BYTES) >> 20))


def _write(proc: subprocess.Popen, sel: selectors.BaseSelector, pending: memoryview) -> memoryview:
    assert proc.stdin is not None
    try:
        sent = os.write(proc.stdin.fileno(), pending[:1 << 16])
    except BlockingIOError:
        return pending
    except (BrokenPipeError, OSError):  # ssh stopped reading (it failed): what it said comes on stderr
        sent = len(pending)
    pending = pending[sent:]
    if not pending:
        sel.unregister(proc.stdin)
        proc.stdin.close()
    return pending


def _split_stderr(err: bytes) -> Tuple[List[str], bytes]:
    """(ssh's own lines, the remote command's stderr): ssh's are its debug lines and its few messages."""
    mine: List[str] = []
    remote: List[bytes] = []
    for line in err.splitlines(keepends=True):
        bare = line.rstrip(b"\r\n")
        if _DEBUG.match(bare) or bare.startswith((b"Warning: Permanently added", b"OpenSSH_", b"Authenticated to ",
                                                   b"Transferred: ", b"Bytes per second", b"Connection to ")):
            mine.append(bare.decode("utf-8", "replace"))
        else:
            remote.append(line)
    return mine, b"".join(remote)


_HOST_KEY = re.compile(r"debug1: Server host key: (\S+) (SHA256:\S+)")
_OFFERED = re.compile(r"debug1: Offering public key: (\S+)(?: [A-Z0-9-]+)? (SHA256:\S+)")
_ACCEPTED = re.compile(r"debug1: Server accepts key: (.{0,300}?)(?: explicit| agent)*$")
_OFFENDING = re.compile(r"Offending (?:\S+ )?key (?:for IP )?in (.+):(\d+)")


def _notes(conn: Connection, lines: List[str]) -> List[str]:
    """What to tell the user of a connection that worked: a host key ssh recorded (accept-new)."""
    out = []
    for line in lines:
        if line.startswith("Warning: Permanently added"):
            key = next((m for m in map(_HOST_KEY.search, lines) if m), None)
            out.append("recorded new host key for {}{} ({})".format(
                conn.name, " ({} {})".format(key.group(1), key.group(2)) if key else "", line[len("Warning: "):]))
    return out


def _failure(conn: Connection, lines: List[str], err: bytes) -> SshError:
    """The SshError for ssh's exit 255, by what it said, in the words the paramiko transport uses (one message
    per failure, whatever the transport)."""
    text = err.decode("utf-8", "replace")
    said = [x for x in text.splitlines() if x.strip() and not x.startswith("debug")]
    key = next((m for m in map(_HOST_KEY.search, lines) if m), None)
    if "REMOTE HOST IDENTIFICATION HAS CHANGED" in text or re.search(r"Host key for \S+ has changed", text):
        offending = _OFFENDING.search(text)
        holder = offending.group(1) if offending else os.path.expanduser(
            conn.settings.get("userknownhostsfile", "~/.ssh/known_hosts").split()[0])
        return SshError("host_key_refused", (
            "WARNING: the host key of {} has CHANGED (now {}). Someone may be intercepting the connection "
            "(man-in-the-middle), or the host was reinstalled. Refused whatever the options; if the change is "
            "expected, remove the old key: ssh-keygen -f '{}' -R '{}'").format(
                conn.name, "{} {}".format(key.group(1), key.group(2)) if key else "another key", holder, conn.name))
    if "Host key verification failed" in text or re.search(r"No \S+ host key is known for", text):
        return SshError("host_key_refused", (
            "{} is not a known host ({}). Check the fingerprint, then accept it with --accept-new-host-keys (or "
            "StrictHostKeyChecking accept-new)").format(
                conn.name, "{} key {}".format(key.group(1), key.group(2)) if key else "its key is not shown"))
    if re.search(r"Permission denied \(|Too many authentication failures|No more authentication methods", text):
        return _auth_failure(conn, lines)
    return _network_failure(conn, text, said)


def _auth_failure(conn: Connection, lines: List[str]) -> SshError:
    who = "{}@{}".format(conn.settings.get("user", "?"), conn.name)
    accepted = [m.group(1).strip() for m in map(_ACCEPTED.search, lines) if m]
    if accepted and not conn.options.interactive:  # the server took the key; its private half needs unlocking
        return SshError("auth_failed", "{}: the server accepts {}, but the key needs a passphrase and this is not "
                        "a terminal: load it into ssh-agent (ssh-add), or inspect this one host from a "
                        "terminal".format(who, accepted[0]))
    tried = ", ".join(dict.fromkeys("{} {}".format(m.group(1), m.group(2)) for m in map(_OFFERED.search, lines) if m))
    return SshError("auth_failed", "{}: no key was accepted (tried {}). Choose the user with user@host or User, the "
                    "key with --identity FILE or IdentityFile in the ssh config".format(
                        who, tried or "no key at all: no agent, no IdentityFile, no ~/.ssh/id_*"))


_CONNECT = re.compile(r"connect to host \S+ port \d+: (.{1,120})$", re.M)


def _network_failure(conn: Connection, text: str, said: List[str]) -> SshError:
    m = _CONNECT.search(text)
    if m is not None:  # ssh's own words after the host: "Connection refused", "Connection timed out", …
        return SshError("unreachable", "{}: {}".format(conn.name, m.group(1).strip()))
    if "banner exchange" in text and "timed out" in text:  # paramiko's words for the same silent port
        return SshError("unreachable", "{}: no SSH handshake within {} s (the port accepts TCP but does not speak "
                        "SSH)".format(conn.name, conn.connect_timeout))
    for words, why in (("Could not resolve hostname", "cannot resolve the host name"),
                       ("Connection closed by", "the connection was closed before SSH began"),
                       ("Connection reset by", "the connection was reset"),
                       ("kex_exchange_identification", "the connection was closed before SSH began"),
                       ("banner exchange", "no SSH handshake"),
                       ("Connection timed out", "connection timed out")):
        if words in text:
            return SshError("unreachable", "{}: {} ({})".format(conn.name, why, _short(said)))
    return SshError("error", "{}: ssh failed: {}".format(conn.name, _short(said) or "exit 255"))


def _short(lines: List[str]) -> str:
    line = lines[-1].strip() if lines else ""
    return line if len(line) <= 200 else line[:197] + "..."


def _last_line(err: bytes) -> str:
    lines = [x for x in err.decode("utf-8", "replace").splitlines() if x.strip()]
    return _short(lines)


def usable_note() -> str:
    """One line for stderr when the default transport falls back to paramiko."""
    return "kvforensics: no OpenSSH client ≥ {}.{} on PATH: connecting with paramiko (its config support is " \
        "narrower: no ProxyCommand, no Match exec)".format(*MIN_VERSION)


def is_terminal() -> bool:
    return sys.stdin.isatty()
