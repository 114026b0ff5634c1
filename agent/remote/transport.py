"""How the fleet reaches a host: one interface, two transports, chosen once per run.

* ``openssh`` (agent/remote/openssh.py), the default when an OpenSSH client ≥ 7.6 is on PATH: the system's
  ``ssh``, so whatever ``ssh HOST`` honours (ProxyCommand, Match exec, certificates, agents, multiplexing)
  works here too;
* ``paramiko`` (agent/remote/ssh.py): the fallback for a machine without an OpenSSH client, said in one line.

The fleet code, the progress bar, the summary and ``--json`` see only ``Transport.open(target, deadline)`` and a
connection's ``exec``, ``notes`` and ``close``; every failure is an ``SshError`` with one of the fleet statuses.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, List, Optional, Protocol

from kvforensics.agent.remote.outcome import ExecResult

CHOICES = ("auto", "openssh", "paramiko")


class Connection(Protocol):
    notes: List[str]

    def exec(self, command: str, stdin: bytes, deadline: float) -> ExecResult: ...  # noqa: E704

    def close(self) -> None: ...  # noqa: E704


class Transport(Protocol):
    name: str

    def open(self, target: str, deadline: float) -> Connection: ...  # noqa: E704

    def abandon(self) -> None: ...  # noqa: E704 - the sweep stopped: end what runs, open nothing more


@dataclass(frozen=True)
class Settings:
    ssh_config: Optional[str] = None
    accept_new: bool = False
    identity: Optional[str] = None
    multiplex: bool = True
    interactive: bool = False


class _ParamikoConnection:
    def __init__(self, session: Any) -> None:
        self.session = session
        self.notes = session.notes

    def exec(self, command: str, stdin: bytes, deadline: float) -> ExecResult:
        from kvforensics.agent.remote import ssh

        return ssh.exec_once(self.session, command, stdin, deadline)

    def close(self) -> None:
        self.session.close()


class Paramiko:
    """paramiko behind the interface: the ssh config read by paramiko (ProxyJump, IdentityFile, known hosts)."""

    name = "paramiko"

    def __init__(self, settings: Settings) -> None:
        from kvforensics.agent.remote import ssh

        self.settings = settings
        self.config = ssh.load_config(settings.ssh_config)

    def open(self, target: str, deadline: float) -> Connection:
        from kvforensics.agent.remote import ssh

        spec = ssh.resolve(target, self.config, self.settings.accept_new, self.settings.identity)
        return _ParamikoConnection(ssh.connect(spec, self.config, deadline, self.settings.accept_new,
                                               self.settings.interactive))

    def abandon(self) -> None:
        """Nothing to end: paramiko's sessions are this process's own sockets, closed with it (the sweep's
        threads are daemons), and sshd then hangs up their sessions."""


class OpenSsh:
    """The system's ssh (agent/remote/openssh.py)."""

    name = "openssh"

    def __init__(self, settings: Settings) -> None:
        from kvforensics.agent.remote import openssh

        self.options = openssh.Options(ssh_config=settings.ssh_config, accept_new=settings.accept_new,
                                       identity=settings.identity, multiplex=settings.multiplex,
                                       interactive=settings.interactive)
        self.sessions = openssh.Sessions()

    def open(self, target: str, deadline: float) -> Connection:
        from kvforensics.agent.remote import openssh

        return openssh.connect(target, self.options, deadline, self.sessions)

    def abandon(self) -> None:
        self.sessions.abandon()


def choose(name: str, settings: Settings) -> Transport:
    """The transport asked for; "auto": OpenSSH when its client is usable, else paramiko (said on stderr)."""
    from kvforensics.agent.remote import openssh

    if name == "paramiko":
        return Paramiko(settings)
    if name == "openssh" or openssh.find_client() is not None:
        return OpenSsh(settings)
    sys.stderr.write(openssh.usable_note() + "\n")
    return Paramiko(settings)
