"""SSH to inspected hosts with paramiko, behaving like OpenSSH where it matters for safety.

* ``~/.ssh/config`` (or ``--ssh-config``): HostName, User, Port, IdentityFile, IdentitiesOnly,
  ProxyJump (several hops), ConnectTimeout, ServerAliveInterval, UserKnownHostsFile,
  StrictHostKeyChecking.
* Host keys: an unknown host is refused with its fingerprint and how to accept it; with
  ``--accept-new-host-keys`` or ``StrictHostKeyChecking accept-new`` (or ``no``, which is
  treated as accept-new: changed keys are never accepted) a new host is recorded in
  known_hosts atomically under a lock. A host whose key differs from the recorded one is
  always refused.
* Authentication: ssh-agent keys, then IdentityFile(s), then the default identities (unless
  IdentitiesOnly). A passphrase is asked only on a terminal; in batch use encrypted keys are
  skipped with a note.
Every failure is a ``SshError`` whose ``status`` is one of the fleet statuses.
"""

from __future__ import annotations

import base64
import fcntl
import getpass
import hashlib
import logging
import os
import re
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import paramiko

from kvforensics.agent.remote.outcome import MAX_STDERR_BYTES, MAX_STDOUT_BYTES, ExecResult, SshError
from kvforensics.agent.remote.targets import port_number, split_target

__all__ = ["ExecResult", "HostSpec", "MAX_STDERR_BYTES", "MAX_STDOUT_BYTES", "SshError", "connect", "exec_once",
           "load_config", "resolve"]

# paramiko logs transport errors itself; kvforensics reports each host's failure in one line.
logging.getLogger("paramiko").setLevel(logging.CRITICAL + 1)

DEFAULT_IDENTITIES = ("~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa")
DEFAULT_KNOWN_HOSTS = ("~/.ssh/known_hosts",)
SYSTEM_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts"


@dataclass(frozen=True)
class HostSpec:
    """An SSH target resolved with the ssh config: where and as whom to connect, keys, jump hosts, host-key policy."""

    target: str  # as the user typed it
    hostname: str
    port: int
    user: str
    identity_files: Tuple[str, ...] = ()
    identities_only: bool = False
    proxy_jump: Tuple[str, ...] = ()
    connect_timeout: Optional[float] = None
    server_alive_interval: Optional[int] = None
    known_hosts: Tuple[str, ...] = DEFAULT_KNOWN_HOSTS
    strict: str = "yes"  # yes | accept-new | no | ask

    @property
    def known_hosts_name(self) -> str:
        """How OpenSSH names this host in known_hosts."""
        return self.hostname if self.port == 22 else "[{}]:{}".format(self.hostname, self.port)


_HOSTNAME = re.compile(r"^(?:[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,252})|[0-9A-Fa-f:.]+(?:%\w+)?)\Z")


def _port(text: str, where: str) -> int:
    try:
        return port_number(text, where)
    except ValueError as exc:
        raise SshError("error", str(exc)) from None


def _split_target(target: str) -> Tuple[Optional[str], str, Optional[int]]:
    try:
        return split_target(target)
    except ValueError as exc:
        raise SshError("error", str(exc)) from None


def load_config(path: Optional[str]) -> paramiko.SSHConfig:
    """The OpenSSH client config, refused whole if it holds ``Match exec``: paramiko would run that
    local command while merely looking a host up."""
    path = os.path.expanduser(path or "~/.ssh/config")
    if not os.path.exists(path):
        return paramiko.SSHConfig()
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError as exc:
        raise SshError("error", "{}: cannot read: {}".format(path, exc.strerror or exc)) from None
    for number, line in enumerate(text.splitlines(), 1):
        words = line.strip().lower().replace("=", " ").split()
        if words[:1] == ["match"] and "exec" in words[1:]:
            raise SshError("error", "{} line {}: 'Match exec' runs a local command; kvforensics does not run "
                           "it (use Host blocks)".format(path, number))
    return paramiko.SSHConfig.from_path(path)


def resolve(target: str, config: paramiko.SSHConfig, accept_new: bool = False,
            identity: Optional[str] = None) -> HostSpec:
    user, host, port = _split_target(target)
    if not host or host.startswith("-"):
        raise SshError("error", "{!r} is not a host".format(target))
    entry = config.lookup(host)
    if entry.get("proxycommand") and entry["proxycommand"].lower() != "none":
        raise SshError("error", "{}: ProxyCommand is not supported (it runs a local shell command); use "
                       "ProxyJump".format(target))
    hostname = entry.get("hostname", host)
    if not _HOSTNAME.match(hostname):  # e.g. an unexpanded "gpu-{01..03}" from /bin/sh
        raise SshError("error", "{!r} is not a host name (letters, digits, '.', '-', or an IP address)".format(
            hostname))
    port = port or _port(str(entry.get("port", 22)), "{} (ssh config Port)".format(target))
    user = user or entry.get("user") or getpass.getuser()
    jumps = tuple(j.strip() for j in entry.get("proxyjump", "").split(",") if j.strip() and j.strip() != "none")
    strict = entry.get("stricthostkeychecking", "yes").lower()
    if accept_new and strict in ("yes", "ask"):
        strict = "accept-new"
    timeout = entry.get("connecttimeout")
    alive = entry.get("serveraliveinterval")
    known = tuple(entry.get("userknownhostsfile", "").split()) or DEFAULT_KNOWN_HOSTS
    return HostSpec(target=target, hostname=hostname, port=port, user=user,
                    identity_files=((identity,) if identity else ()) + tuple(entry.get("identityfile", ())),
                    identities_only=entry.get("identitiesonly", "no").lower() == "yes",
                    proxy_jump=jumps, connect_timeout=float(timeout) if timeout else None,
                    server_alive_interval=int(alive) if alive else None, known_hosts=known,
                    strict="accept-new" if strict == "no" else strict)


def fingerprint(key: paramiko.PKey) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def _known_hosts(spec: HostSpec) -> paramiko.HostKeys:
    keys = paramiko.HostKeys()
    for path in spec.known_hosts + (SYSTEM_KNOWN_HOSTS,):
        path = os.path.expanduser(path)
        if os.path.exists(path):
            try:
                keys.load(path)
            except (OSError, paramiko.SSHException):
                continue
    return keys


def check_host_key(spec: HostSpec, key: paramiko.PKey) -> Optional[str]:
    """Verify ``key``; returns a note when a new key was recorded, raises SshError to refuse."""
    name = spec.known_hosts_name
    known = _known_hosts(spec).lookup(name)
    if known:
        recorded = known.get(key.get_name())
        if recorded is not None and recorded == key:
            return None
        holder = _file_holding(spec, name)
        raise SshError("host_key_refused", (
            "WARNING: the host key of {} has CHANGED (now {} {}). Someone may be intercepting the connection "
            "(man-in-the-middle), or the host was reinstalled. Refused whatever the options; if the change is "
            "expected, remove the old key: ssh-keygen -f '{}' -R '{}'").format(
                name, key.get_name(), fingerprint(key), holder, name))
    if spec.strict != "accept-new":
        raise SshError("host_key_refused", (
            "{} is not a known host ({} key {}). Check the fingerprint, then accept it with "
            "--accept-new-host-keys (or StrictHostKeyChecking accept-new)").format(name, key.get_name(),
                                                                                   fingerprint(key)))
    path = os.path.expanduser(spec.known_hosts[0])
    record_host_key(path, name, key)
    return "recorded new host key for {} ({} {}) in {}".format(name, key.get_name(), fingerprint(key), path)


def _file_holding(spec: HostSpec, name: str) -> str:
    """The known_hosts file that records ``name`` (the one ssh-keygen -R must edit)."""
    for path in [os.path.expanduser(p) for p in spec.known_hosts] + [SYSTEM_KNOWN_HOSTS]:
        if os.path.exists(path):
            keys = paramiko.HostKeys()
            try:
                keys.load(path)
            except (OSError, paramiko.SSHException):
                continue
            if keys.lookup(name):
                return path
    return os.path.expanduser(spec.known_hosts[0])


def record_host_key(path: str, name: str, key: paramiko.PKey) -> None:
    """Append ``name key`` to known_hosts: under a lock (on the folder itself, so no lock file is
    left behind), via a temp file and rename."""
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, mode=0o700, exist_ok=True)
    lock = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            current = open(path, "rb").read() if os.path.exists(path) else b""
            keys = paramiko.HostKeys()
            if current:
                keys.load(path)
            if keys.lookup(name) and keys.lookup(name).get(key.get_name()) == key:
                return  # another run recorded it meanwhile
            line = "{} {} {}\n".format(name, key.get_name(), key.get_base64()).encode()
            if current and not current.endswith(b"\n"):
                current += b"\n"
            fd, tmp = tempfile.mkstemp(prefix=".known_hosts.", dir=folder)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(current + line)
                    f.flush()
                    os.fsync(f.fileno())
                os.chmod(tmp, 0o600)
                os.replace(tmp, path)
            except BaseException:
                if os.path.exists(tmp):
                    os.unlink(tmp)
                raise
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    finally:
        os.close(lock)


def _load_key(path: str, interactive: bool, notes: List[str]) -> Optional[paramiko.PKey]:
    path = os.path.expanduser(path)
    if not os.path.exists(path):
        return None
    try:
        return paramiko.PKey.from_path(path)
    except (paramiko.PasswordRequiredException, TypeError) as exc:
        # paramiko raises TypeError ("password-protected") for OpenSSH-format encrypted keys
        if isinstance(exc, TypeError) and "password" not in str(exc).lower():
            notes.append("could not read {}: {}".format(path, exc))
            return None
        if not interactive:
            notes.append("skipped {}: it needs a passphrase and this is not a terminal".format(path))
            return None
        try:
            return paramiko.PKey.from_path(path, getpass.getpass("Passphrase for {}: ".format(path)))
        except (paramiko.SSHException, ValueError, TypeError) as exc:
            notes.append("could not unlock {}: {}".format(path, exc))
            return None
    except (paramiko.SSHException, ValueError, OSError) as exc:
        notes.append("could not read {}: {}".format(path, exc))
        return None


def authenticate(transport: paramiko.Transport, spec: HostSpec, interactive: bool) -> None:
    notes: List[str] = []
    loaded = [(p, _load_key(p, interactive, notes)) for p in spec.identity_files]
    configured = [k for _, k in loaded if k is not None]
    names = {k.get_base64(): os.path.expanduser(p) for p, k in loaded if k is not None}
    candidates: List[paramiko.PKey] = []
    try:
        agent_keys = list(paramiko.Agent().get_keys())
    except (paramiko.SSHException, OSError):
        agent_keys = []
    if spec.identities_only:
        wanted = {k.get_base64() for k in configured}
        candidates.extend(k for k in agent_keys if k.get_base64() in wanted)
    else:
        candidates.extend(agent_keys)
    candidates.extend(configured)
    if not spec.identities_only and not spec.identity_files:
        for p in DEFAULT_IDENTITIES:
            k = _load_key(p, interactive, notes)
            if k is not None:
                candidates.append(k)
                names[k.get_base64()] = os.path.expanduser(p)
    for key in candidates:
        try:
            transport.auth_publickey(spec.user, key)
        except paramiko.AuthenticationException:
            continue
        except paramiko.SSHException as exc:
            raise SshError("auth_failed", "{}@{}: {}".format(spec.user, spec.known_hosts_name, exc)) from None
        if transport.is_authenticated():
            return
    tried = ", ".join("{} {}".format(names.get(k.get_base64(), "agent key"), fingerprint(k)) for k in candidates)
    detail = "; ".join(notes)
    raise SshError("auth_failed", "{}@{}: no key was accepted (tried {}{}). Choose the user with user@host or "
                   "User, the key with --identity FILE or IdentityFile in the ssh config".format(
                       spec.user, spec.known_hosts_name, tried or "no key at all: no agent, no IdentityFile, no "
                       "~/.ssh/id_*", "; " + detail if detail else ""))


@dataclass
class Session:
    """A connected, authenticated chain of transports (jump hosts first)."""

    transports: List[paramiko.Transport] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)

    @property
    def target(self) -> paramiko.Transport:
        return self.transports[-1]

    def close(self) -> None:
        for t in reversed(self.transports):
            try:
                t.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass


def _open_transport(sock: object, spec: HostSpec, timeout: float, session: Session,
                    interactive: bool) -> paramiko.Transport:
    t = paramiko.Transport(sock)
    session.transports.append(t)
    t.banner_timeout = timeout
    t.handshake_timeout = timeout
    t.auth_timeout = timeout
    try:
        t.start_client(timeout=timeout)
    except (paramiko.SSHException, EOFError, OSError) as exc:
        if "banner" in str(exc).lower():  # the port took TCP and sent no SSH banner in time: OpenSSH's words
            raise SshError("unreachable", "{}: no SSH handshake within {:.0f} s (the port accepts TCP but does not "
                                          "speak SSH)".format(spec.known_hosts_name, timeout)) from None
        raise SshError("unreachable", "{}: no SSH handshake ({})".format(spec.known_hosts_name,
                                                                         exc or type(exc).__name__)) from None
    if not t.is_active() or t.session_id is None:
        # start_client returns, without raising, when its timeout passes mid-handshake
        raise SshError("unreachable", "{}: no SSH handshake within {:.0f} s (the port accepts TCP but does not "
                                      "speak SSH)".format(spec.known_hosts_name, timeout))
    note = check_host_key(spec, t.get_remote_server_key())
    if note:
        session.notes.append(note)
    authenticate(t, spec, interactive)
    if spec.server_alive_interval:
        t.set_keepalive(spec.server_alive_interval)
    return t


def connect(spec: HostSpec, config: paramiko.SSHConfig, deadline: float, accept_new: bool = False,
            interactive: Optional[bool] = None) -> Session:
    """Connect through every ProxyJump hop to ``spec``; each hop's key and auth are checked."""
    interactive = sys.stdin.isatty() if interactive is None else interactive
    hops = [resolve(j, config, accept_new) for j in spec.proxy_jump] + [spec]
    session = Session()
    try:
        sock: object = None
        for i, hop in enumerate(hops):
            left = deadline - time.monotonic()
            if left <= 0:
                raise SshError("unreachable", "{}: deadline reached".format(hop.known_hosts_name))
            timeout = min(left, hop.connect_timeout or left)
            if i == 0:
                try:
                    sock = socket.create_connection((hop.hostname, hop.port), timeout=timeout)
                except socket.timeout:
                    raise SshError("unreachable", "{}: connection timed out".format(hop.known_hosts_name)) from None
                except OSError as exc:
                    raise SshError("unreachable", "{}: {}".format(hop.known_hosts_name, exc.strerror or exc)) from None
            else:
                try:
                    sock = session.target.open_channel("direct-tcpip", (hop.hostname, hop.port), ("127.0.0.1", 0),
                                                       timeout=timeout)
                except (paramiko.SSHException, OSError) as exc:
                    raise SshError("unreachable", "{} via {}: {}".format(hop.known_hosts_name,
                                                                          hops[i - 1].known_hosts_name, exc)) from None
            _open_transport(sock, hop, timeout, session, interactive)
        return session
    except BaseException:
        session.close()
        raise


# While a probe runs, its exec loop sleeps on the channel's exit-status event, waking this often to read what
# arrived: a 5 ms poll (before) woke each of 64 threads 200 times a second for the probe's whole run, each
# wake taking the GIL from the threads doing handshakes; the end is seen at once, whatever this is.
_IDLE_WAIT_S = 0.05


def exec_once(session: Session, command: str, stdin: bytes, deadline: float) -> ExecResult:
    """One exec round trip: send stdin, close it, read both streams until exit or deadline.

    Bounded: a host that prints more than MAX_STDOUT_BYTES (or MAX_STDERR_BYTES on stderr) is
    cut off, and every blocking call times out at the deadline (the channel's own timeout, no
    second thread racing to close it)."""
    chan = session.target.open_session(timeout=max(1.0, deadline - time.monotonic()))
    out, err = bytearray(), bytearray()
    try:
        chan.settimeout(max(0.1, deadline - time.monotonic()))
        chan.exec_command(command)
        chan.sendall(stdin)
        chan.shutdown_write()
        while not _drained(chan):
            if chan.recv_ready():
                out += chan.recv(1 << 16)
            elif chan.recv_stderr_ready():
                err += chan.recv_stderr(1 << 16)
            else:  # until the exit status (or close) arrives; data waits in the channel's window meanwhile
                chan.status_event.wait(min(_IDLE_WAIT_S, max(0.0, deadline - time.monotonic())))
            if len(out) > MAX_STDOUT_BYTES or len(err) > MAX_STDERR_BYTES:
                raise SshError("error", "the host printed more than {} MiB: not a kvforensics probe answer".format(
                    (MAX_STDOUT_BYTES if len(out) > MAX_STDOUT_BYTES else MAX_STDERR_BYTES) >> 20))
            if time.monotonic() > deadline:
                raise SshError("unreachable", "deadline reached while the probe ran")
        status = chan.recv_exit_status() if chan.exit_status_ready() else -1
        return ExecResult(status, bytes(out), bytes(err), len(stdin))
    except socket.timeout:
        raise SshError("unreachable", "deadline reached while the probe ran") from None
    finally:
        chan.close()


def _drained(chan: paramiko.Channel) -> bool:
    if chan.recv_ready() or chan.recv_stderr_ready():
        return False
    return chan.exit_status_ready() or chan.closed
