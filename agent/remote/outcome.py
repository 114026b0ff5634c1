"""What every SSH transport returns or raises (agent/remote/transport.py): kept apart from paramiko (~150 ms to
import), which the OpenSSH transport never needs."""

from __future__ import annotations

from dataclasses import dataclass

MAX_STDOUT_BYTES = 64 << 20  # a snapshot with its startup's log lines is a few MB at most
MAX_STDERR_BYTES = 1 << 20


class SshError(Exception):
    """status: unreachable | auth_failed | host_key_refused | error."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class ExecResult:
    """What one remote command gave back: exit status (-1: none came), stdout, stderr, the bytes sent on its stdin."""

    exit_status: int
    stdout: bytes
    stderr: bytes
    bytes_sent: int
