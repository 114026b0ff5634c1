"""Real OpenSSH servers on 127.0.0.1 for the SSH tests: own config, keys and port each."""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, List, Optional

SSHD = shutil.which("sshd") or ("/usr/sbin/sshd" if os.path.exists("/usr/sbin/sshd") else None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def keygen(path: Path, kind: str = "ed25519") -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-f", str(path)], check=True)
    return path


class Sshd:
    def __init__(self, folder: Path, authorized: List[Path], extra: str = "", host_key: Optional[Path] = None) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.host_key = host_key or keygen(folder / "host_ed25519")
        (folder / "authorized_keys").write_text("".join(Path(str(k) + ".pub").read_text() for k in authorized))
        self.config = folder / "sshd_config"
        # Sessions get their own TMPDIR, so "nothing left behind" can be checked without
        # seeing what other processes on the machine (another copy of the suite) write to /tmp.
        self.tmpdir = folder / "session-tmp"
        self.tmpdir.mkdir(exist_ok=True)
        self.config.write_text("\n".join([
            "Port {}".format(self.port), "ListenAddress 127.0.0.1", "HostKey {}".format(self.host_key),
            "PidFile {}".format(folder / "sshd.pid"), "AuthorizedKeysFile {}".format(folder / "authorized_keys"),
            "StrictModes no", "UsePAM no", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
            "PubkeyAuthentication yes", "PermitRootLogin yes", "AllowTcpForwarding yes", "LogLevel ERROR",
            "MaxStartups 100:30:200", "MaxSessions 100", "SetEnv TMPDIR={}".format(self.tmpdir), extra, ""]))
        os.makedirs("/run/sshd", exist_ok=True) if os.geteuid() == 0 else None
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(self.config)], stderr=open(folder / "sshd.err", "w"))
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.05)
        raise RuntimeError("sshd did not start: " + (folder / "sshd.err").read_text())

    @property
    def public_host_key(self) -> str:
        return Path(str(self.host_key) + ".pub").read_text().split()[0:2]

    def known_hosts_line(self) -> str:
        kind, b64 = Path(str(self.host_key) + ".pub").read_text().split()[0:2]
        return "[127.0.0.1]:{} {} {}\n".format(self.port, kind, b64)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def host_options(server: "Sshd", key: Path, known: Path, **extra: object) -> dict:
    """An alias's OpenSSH options for ``server``: its port, this user, one key, its own known_hosts file."""
    opts = {"HostName": "127.0.0.1", "Port": server.port, "User": USER, "IdentityFile": key,
            "IdentitiesOnly": "yes", "UserKnownHostsFile": known, "ConnectTimeout": 5}
    opts.update(extra)
    return opts


def client_config(path: Path, hosts: dict) -> Path:
    """hosts: alias -> dict of OpenSSH options."""
    lines = []
    for alias, options in hosts.items():
        lines.append("Host {}".format(alias))
        for key, value in options.items():
            lines.append("  {} {}".format(key, value))
    path.write_text("\n".join(lines) + "\n")
    return path


USER = getpass.getuser()


def ssh_clients_naming(cfg: Path) -> List[int]:
    """The live ssh processes whose command line names ``cfg`` (one test's config: no other test's)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path("/proc", pid, "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"ssh") and str(cfg).encode() in argv:
            found.append(int(pid))
    return found


@contextmanager
def control_folder() -> Iterator[Path]:
    """A private folder for ssh's master sockets (short: a socket path holds 107 bytes); after the block, the
    masters started there are told to exit now, not a minute later, and the folder goes."""
    folder = Path(tempfile.mkdtemp(prefix="kvf-cm-", dir="/tmp"))
    os.chmod(str(folder), 0o700)
    try:
        yield folder
    finally:
        for sock in folder.iterdir():
            subprocess.run(["ssh", "-o", "ControlPath={}".format(sock), "-O", "exit", "x"], capture_output=True)
        shutil.rmtree(str(folder), ignore_errors=True)  # a master removes its own socket as it exits, maybe later
