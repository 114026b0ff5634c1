"""The deployment files (cron line, systemd units, alert rules and their promtool tests, the Kubernetes
DaemonSet of ``serve`` with its image definition), from
wherever kvforensics was installed, with this installation's paths filled in.

They ship in the wheel as data (``share/kvforensics/deploy``) and sit in ``deploy/`` of a
source checkout; ``kvforensics deploy-files`` writes or prints them, so a pipx install has them.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

FILES = ("kvforensics.cron", "kvforensics-record.service", "kvforensics-record.timer", "kvforensics.rules.yml",
         "kvforensics.rules.test.yml")
# The DaemonSet of `kvforensics serve` and what it needs (README "On Kubernetes"), in a folder of their own:
# `kubectl apply -k DIR/kubernetes`.
KUBERNETES_FILES = tuple("kubernetes/" + name for name in (
    "kustomization.yaml", "namespace.yaml", "serviceaccount.yaml", "daemonset.yaml", "service.yaml",
    "servicemonitor.yaml", "Containerfile"))
# The Grafana dashboard: import it (Dashboards > New > Import) and pick the Prometheus data source.
GRAFANA_FILES = ("grafana/kvforensics.json",)
DEFAULT_BIN = "/opt/kvforensics/bin/kvforensics"
# node_exporter's --collector.textfile.directory as packaged: upstream's docs and RHEL/Fedora's packages use
# the first (the templates hold it), Debian's and Ubuntu's prometheus-node-exporter the second (its binary's
# own default). Upstream's binary has no default: without the flag it reads no textfile at all.
DEFAULT_TEXTFILE_DIR = "/var/lib/node_exporter/textfile_collector"
DEBIAN_TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"
TEXTFILE_FLAG = "--collector.textfile.directory"
# The binaries' names: upstream's and RHEL's node_exporter, Debian's and SUSE's prometheus-node-exporter.
EXPORTERS = {"node_exporter": "", "prometheus-node-exporter": DEBIAN_TEXTFILE_DIR}
# Where packages keep the exporter's arguments: Debian's ARGS, RHEL/Fedora's OPTIONS, SUSE's ARGS.
EXPORTER_SETTINGS = ("etc/default/prometheus-node-exporter", "etc/sysconfig/node_exporter",
                     "etc/sysconfig/prometheus-node-exporter")


@dataclass(frozen=True)
class TextfileDir:
    """The directory node_exporter reads textfiles from, and why kvforensics thinks so (one sentence)."""

    path: str
    why: str


class DeployFilesError(Exception):
    """The files are not where an installation puts them; one sentence."""


def source_dir() -> Path:
    """A source checkout's deploy/ first (editable installs), then the wheel's data files."""
    candidates = [Path(__file__).resolve().parents[2] / "deploy",
                  Path(sys.prefix) / "share" / "kvforensics" / "deploy"]
    for folder in candidates:
        if all((folder / name).is_file() for name in FILES + KUBERNETES_FILES + GRAFANA_FILES):
            return folder
    raise DeployFilesError("the deployment files are not installed (looked in {})".format(
        ", ".join(str(c) for c in candidates)))


def render(binary: Optional[str] = None, textfile_dir: Optional[str] = None,
           image: Optional[str] = None) -> Dict[str, str]:
    """Each file's text, with the kvforensics binary and the textfile directory of this host, and the
    image the DaemonSet runs (as built and pushed to your registry)."""
    folder = source_dir()
    out = {}
    for name in FILES + KUBERNETES_FILES + GRAFANA_FILES:
        text = (folder / name).read_text(encoding="utf-8")
        if binary:
            text = _in_commands(text, DEFAULT_BIN, binary)
        if textfile_dir:
            text = _in_commands(text, DEFAULT_TEXTFILE_DIR, textfile_dir.rstrip("/") or "/")
        if image and name.endswith("daemonset.yaml"):
            text = re.sub(r"(?m)^(\s*image: ).*$", lambda m: m.group(1) + image, text)
        out[name] = text
    return out


def _in_commands(text: str, old: str, new: str) -> str:
    """Replace ``old`` in the lines that run something, not in the comments (which name both packaged
    directories, and must keep naming them)."""
    return "".join(line if line.lstrip().startswith("#") else line.replace(old, new)
                   for line in text.splitlines(keepends=True))


def write(folder: str, files: Dict[str, str]) -> List[str]:
    written = []
    for name, text in files.items():
        path = os.path.join(folder, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        written.append(path)
    return written


def installed_binary() -> Optional[str]:
    """The kvforensics entry point next to this interpreter, if there is one (a venv or pipx)."""
    candidate = Path(sys.executable).parent / "kvforensics"
    return str(candidate) if candidate.exists() else None


# --- which directory node_exporter reads ---------------------------------------------------

def find_textfile_dir(root: str = "/") -> TextfileDir:
    """node_exporter's textfile directory on this host: a running node_exporter's own (its flag, else its
    binary's default), else its package's settings file, else the default of the distribution's package."""
    running = list(_running_exporters(root))
    if running:
        return _from_running(running)
    for rel in EXPORTER_SETTINGS:
        found = _flag_value(_settings_args(os.path.join(root, rel)))
        if found:
            return TextfileDir(found, "{} of /{} (node_exporter is not running now)".format(TEXTFILE_FLAG, rel))
    if _debian_like(root):
        return TextfileDir(DEBIAN_TEXTFILE_DIR, "the default of Debian's and Ubuntu's prometheus-node-exporter "
                                                "package (this host is {}; no node_exporter runs now)".format(
                                                    _os_name(root)))
    return TextfileDir(DEFAULT_TEXTFILE_DIR, "the directory upstream's and RHEL's node_exporter packages set (no "
                                             "node_exporter runs now, none is configured in /etc)")


def _from_running(running: List[Tuple[int, str, List[str]]]) -> TextfileDir:
    pid, name, argv = running[0]
    others = "" if len(running) == 1 else "; {} more run (PIDs {}): pass --textfile-dir if another is the " \
        "one Prometheus scrapes".format(len(running) - 1, ", ".join(str(p) for p, _, _ in running[1:]))
    if "--no-collector.textfile" in argv:
        raise DeployFilesError("the running {} (PID {}) has its textfile collector off (--no-collector.textfile): "
                               "turn it on, or pass --textfile-dir".format(name, pid))
    flag = _flag_value(argv)
    if flag:
        return TextfileDir(flag, "the running {} (PID {}) reads it ({}){}".format(name, pid, TEXTFILE_FLAG, others))
    if EXPORTERS[name]:
        return TextfileDir(EXPORTERS[name], "the running {} (PID {}) has no {}: its package's default{}".format(
            name, pid, TEXTFILE_FLAG, others))
    raise DeployFilesError("the running {} (PID {}) reads no textfiles: it was started without {} (upstream's "
                           "binary has no default); add {}={} to its arguments, or pass --textfile-dir".format(
                               name, pid, TEXTFILE_FLAG, TEXTFILE_FLAG, DEFAULT_TEXTFILE_DIR))


def _running_exporters(root: str) -> Iterator[Tuple[int, str, List[str]]]:
    """(PID, binary name, arguments) of each node_exporter process, lowest PID first."""
    proc = os.path.join(root, "proc")
    try:
        pids = sorted(int(n) for n in os.listdir(proc) if n.isdigit())
    except OSError:
        return
    for pid in pids:
        try:
            with open(os.path.join(proc, str(pid), "cmdline"), "rb") as f:
                argv = [a.decode("utf-8", "replace") for a in f.read(1 << 16).split(b"\0")[:-1]]
        except OSError:
            continue  # gone, or not ours to read
        name = os.path.basename(argv[0]) if argv else ""
        if name in EXPORTERS:
            yield pid, name, argv[1:]


def _flag_value(args: List[str]) -> Optional[str]:
    """The textfile directory a node_exporter argument list sets (``--flag=DIR`` or ``--flag DIR``; the last
    one wins, as in kingpin)."""
    found = None
    for i, arg in enumerate(args):
        if arg.startswith(TEXTFILE_FLAG + "="):
            found = arg.split("=", 1)[1]
        elif arg == TEXTFILE_FLAG and i + 1 < len(args):
            found = args[i + 1]
    if found is None:
        return None
    return found.strip("\"'") or None


def _settings_args(path: str) -> List[str]:
    """The arguments a package's settings file (shell variable assignments) gives the exporter."""
    import shlex

    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(1 << 16)
    except OSError:
        return []
    args: List[str] = []
    for line in text.splitlines():
        name, sep, value = line.strip().partition("=")
        if sep and name in ("ARGS", "OPTIONS", "NODE_EXPORTER_ARGS"):
            try:
                args += " ".join(shlex.split(value)).split()  # ARGS="--a --b" and ARGS=--a alike
            except ValueError:
                continue
    return args


def _os_release(root: str) -> Dict[str, str]:
    out: Dict[str, str] = {}
    for rel in ("etc/os-release", "usr/lib/os-release"):
        try:
            with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
                text = f.read(1 << 16)
        except OSError:
            continue
        for line in text.splitlines():
            key, sep, value = line.partition("=")
            if sep:
                out[key.strip()] = value.strip().strip("\"'")
        return out
    return out


def _debian_like(root: str) -> bool:
    info = _os_release(root)
    words = (info.get("ID", "") + " " + info.get("ID_LIKE", "")).lower().split()
    return any(w in ("debian", "ubuntu") for w in words)


def _os_name(root: str) -> str:
    info = _os_release(root)
    return info.get("PRETTY_NAME") or info.get("ID") or "Debian-like"
