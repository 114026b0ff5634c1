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

from kvforensics.agent.cli import deploy_values as dv
from kvforensics.agent.cli import trusted_paths as tp
from kvforensics.collectors import procfs

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
    """Each file's text, with the kvforensics binary and the textfile directory of this host (in the cron
    line and the systemd service: the image installs its own /opt/kvforensics), and the image the DaemonSet
    runs (as built and pushed to your registry). Each value is checked and quoted for the file's reader
    (deploy_values); one that cannot be written safely is a DeployFilesError."""
    try:
        words = {DEFAULT_BIN: dv.absolute_path(binary, "--bin") if binary else DEFAULT_BIN,
                 DEFAULT_TEXTFILE_DIR: dv.absolute_path(textfile_dir, "the textfile directory")
                 if textfile_dir else DEFAULT_TEXTFILE_DIR}
        image = dv.image_reference(image) if image else None
    except dv.BadValue as exc:
        raise DeployFilesError(str(exc)) from None
    folder = source_dir()
    out = {}
    for name in FILES + KUBERNETES_FILES + GRAFANA_FILES:
        text = (folder / name).read_text(encoding="utf-8")
        if name == "kvforensics.cron":
            text = _in_commands(text, words, lambda w, line: dv.cron_word(w))
        elif name.endswith(".service"):
            text = _in_commands(text, words, lambda w, line: dv.systemd_word(w, line.startswith("ExecStart=")))
        if image and name.endswith("daemonset.yaml"):
            text = re.sub(r"(?m)^(\s*image: ).*$", lambda m: m.group(1) + image, text)
        out[name] = text
    return out


def _in_commands(text: str, words: Dict[str, str], quote) -> str:
    """Each word of a line that runs something (not the comments, which name both packaged directories and
    must keep naming them) that is, or starts with, a template's path: that path replaced, the word quoted
    for the file's reader. The templates' words are plain (no quotes, single spaces)."""
    lines = []
    for line in text.splitlines(keepends=True):
        if not line.lstrip().startswith("#"):
            body, end = line.rstrip("\n"), line[len(line.rstrip("\n")):]
            line = " ".join(_word(w, words, quote, body) for w in body.split(" ")) + end
        lines.append(line)
    return "".join(lines)


def _word(word: str, words: Dict[str, str], quote, line: str) -> str:
    setting, _, value = word.rpartition("=") if word.split("=", 1)[0].isalpha() else ("", "", word)
    optional = "-" if value.startswith("-/") else ""  # systemd's "missing is fine" prefix
    value = value[len(optional):]
    for old, new in words.items():
        if value == old or value.startswith(old + "/"):
            new_word = optional + new + value[len(old):]
            return setting + ("=" if setting else "") + quote(new_word, line)
    return word


def write(folder: str, files: Dict[str, str]) -> Tuple[str, List[str]]:
    """Write the files into ``folder`` (made if missing) as a root tool must: the folder and every one above it
    root's or the caller's and writable by no one else, a link followed only when root or the caller owns
    it, each file made fresh and renamed into place (trusted_paths). Returns where the folder really is and
    the paths written; raises trusted_paths.UntrustedPath or OSError."""
    opened = tp.open_folder(folder)
    inner: Dict[str, tp.Folder] = {"": opened}
    try:
        for name in files:  # every subfolder checked before any file is written
            sub = os.path.dirname(name)
            if sub not in inner:
                inner[sub] = tp.subfolder(opened, sub)
        return opened.path, [tp.write_file(inner[os.path.dirname(name)], os.path.basename(name), text)
                             for name, text in files.items()]
    finally:
        for each in inner.values():
            os.close(each.fd)


def installed_binary() -> Optional[str]:
    """The kvforensics entry point next to this interpreter, if there is one (a venv or pipx)."""
    candidate = Path(sys.executable).parent / "kvforensics"
    return str(candidate) if candidate.exists() else None


# --- which directory node_exporter reads ---------------------------------------------------

def find_textfile_dir(root: str = "/") -> TextfileDir:
    """node_exporter's textfile directory on this host: a running node_exporter's own (its flag, else its
    binary's default), else its package's settings file, else the default of the distribution's package.

    Any local user can start a process named node_exporter with any flag, and root writes what is found into
    the cron line: a running exporter counts only when it runs a root-owned exporter binary (``/proc/PID/exe``
    in folders only root can write) as root or a system account, a settings file only when it is root's
    alone, and a directory only when it is an absolute path of printable characters."""
    running, ignored = _verified(list(_running_exporters(root)), root)
    if running:
        return _checked(_from_running(running, ignored))
    for rel in EXPORTER_SETTINGS:
        path = os.path.join(root, rel)
        if not os.path.exists(path):
            continue
        distrust = tp.why_untrusted_file(path, root)
        if distrust:
            ignored.append("/{} ({})".format(rel, distrust))
            continue
        found = _flag_value(_settings_args(path))
        if found:
            return _checked(TextfileDir(found, "{} of /{} (node_exporter is not running now){}".format(
                TEXTFILE_FLAG, rel, _ignoring(ignored))))
    if _debian_like(root):
        return TextfileDir(DEBIAN_TEXTFILE_DIR, "the default of Debian's and Ubuntu's prometheus-node-exporter "
                                                "package (this host is {}; no node_exporter runs now{})".format(
                                                    dv.printable(_os_name(root)), _ignoring(ignored)))
    return TextfileDir(DEFAULT_TEXTFILE_DIR, "the directory upstream's and RHEL's node_exporter packages set (no "
                                             "node_exporter runs now, none is configured in /etc{})".format(
                                                 _ignoring(ignored)))


def _ignoring(ignored: List[str]) -> str:
    return "; ignored: " + "; ".join(ignored) if ignored else ""


def _checked(found: TextfileDir) -> TextfileDir:
    try:
        return TextfileDir(dv.absolute_path(found.path, "the textfile directory"), found.why)
    except dv.BadValue as exc:
        raise DeployFilesError("{} ({}): pass --textfile-dir".format(exc, found.why)) from None


Exporter = Tuple[int, str, List[str]]


def _verified(running: List[Exporter], root: str) -> Tuple[List[Exporter], List[str]]:
    """The exporters whose word is taken, and a phrase for each one that is not."""
    login_uid_min = _uid_min(root)
    kept: List[Exporter] = []
    ignored: List[str] = []
    for pid, name, argv in running:
        why = _why_not_an_exporter(os.path.join(root, "proc", str(pid)), name, login_uid_min, root)
        if why:
            ignored.append("PID {} named {} ({})".format(pid, name, why))
        else:
            kept.append((pid, name, argv))
    return kept, ignored


def _why_not_an_exporter(proc: str, name: str, login_uid_min: int, root: str) -> Optional[str]:
    try:
        exe = os.readlink(os.path.join(proc, "exe"))
    except OSError as exc:
        return "its binary cannot be read: {}".format(exc.strerror)
    if exe.endswith(" (deleted)") or os.path.basename(exe) not in EXPORTERS:
        return "it runs {}".format(dv.printable(exe))
    uid = _real_uid(proc)
    if uid is None or (uid != 0 and uid >= login_uid_min):
        return "run by {}, not root or a system account".format("an unknown user" if uid is None else
                                                                 "uid {}".format(uid))
    distrust = tp.why_untrusted_file(exe, root)
    return "its binary: {}".format(distrust) if distrust else None


def _real_uid(proc: str) -> Optional[int]:
    try:
        with open(os.path.join(proc, "status"), encoding="ascii", errors="replace") as f:
            return procfs.parse_uid(f.read(1 << 14))
    except OSError:
        return None


def _uid_min(root: str) -> int:
    """The first login account's uid (login.defs' UID_MIN; 1000 on Debian, RHEL and SUSE alike)."""
    try:
        with open(os.path.join(root, "etc", "login.defs"), encoding="utf-8", errors="replace") as f:
            for line in f.read(1 << 16).splitlines():
                words = line.split()
                if len(words) == 2 and words[0] == "UID_MIN" and words[1].isdigit():
                    return min(int(words[1]), 60000)
    except OSError:
        pass
    return 1000


def _from_running(running: List[Exporter], ignored: List[str]) -> TextfileDir:
    pid, name, argv = running[0]
    others = "" if len(running) == 1 else "; {} more run (PIDs {}): pass --textfile-dir if another is the " \
        "one Prometheus scrapes".format(len(running) - 1, ", ".join(str(p) for p, _, _ in running[1:]))
    others += _ignoring(ignored)
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


def _running_exporters(root: str) -> Iterator[Exporter]:
    """(PID, binary name, arguments) of each process named like node_exporter, lowest PID first."""
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
