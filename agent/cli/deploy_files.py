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
from pathlib import Path
from typing import Dict, List, Optional

FILES = ("kvforensics.cron", "kvforensics-record.service", "kvforensics-record.timer", "kvforensics.rules.yml",
         "kvforensics.rules.test.yml")
# The DaemonSet of `kvforensics serve` and what it needs (README "On Kubernetes"), in a folder of their own:
# `kubectl apply -k DIR/kubernetes`.
KUBERNETES_FILES = tuple("kubernetes/" + name for name in (
    "kustomization.yaml", "namespace.yaml", "serviceaccount.yaml", "daemonset.yaml", "service.yaml",
    "servicemonitor.yaml", "Containerfile"))
DEFAULT_BIN = "/opt/kvforensics/bin/kvforensics"
DEFAULT_TEXTFILE_DIR = "/var/lib/node_exporter/textfile_collector"


class DeployFilesError(Exception):
    """The files are not where an installation puts them; one sentence."""


def source_dir() -> Path:
    """A source checkout's deploy/ first (editable installs), then the wheel's data files."""
    candidates = [Path(__file__).resolve().parents[2] / "deploy",
                  Path(sys.prefix) / "share" / "kvforensics" / "deploy"]
    for folder in candidates:
        if all((folder / name).is_file() for name in FILES + KUBERNETES_FILES):
            return folder
    raise DeployFilesError("the deployment files are not installed (looked in {})".format(
        ", ".join(str(c) for c in candidates)))


def render(binary: Optional[str] = None, textfile_dir: Optional[str] = None,
           image: Optional[str] = None) -> Dict[str, str]:
    """Each file's text, with the kvforensics binary and the textfile directory of this host, and the
    image the DaemonSet runs (as built and pushed to your registry)."""
    folder = source_dir()
    out = {}
    for name in FILES + KUBERNETES_FILES:
        text = (folder / name).read_text(encoding="utf-8")
        if binary:
            text = text.replace(DEFAULT_BIN, binary)
        if textfile_dir:
            text = text.replace(DEFAULT_TEXTFILE_DIR, textfile_dir.rstrip("/"))
        if image and name.endswith("daemonset.yaml"):
            text = re.sub(r"(?m)^(\s*image: ).*$", lambda m: m.group(1) + image, text)
        out[name] = text
    return out


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
