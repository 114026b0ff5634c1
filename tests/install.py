"""This source tree installed as the README says: copied (so the build leaves nothing in the checkout), then
``pip install``-ed into a venv of its own. For the tests of what an install holds and does, and for the bench
figures measured as users run the command (bytecode compiled by pip, no editable finder in site)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

__all__ = ["SOURCES", "clean_env", "install_copy"]

SOURCES = ("pyproject.toml", "README.md", "LICENSE", "kvforensics", "agent", "collectors", "reports", "deploy")


def clean_env() -> dict:
    """This environment without what would point an installed kvforensics elsewhere."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FAKE_NVML_SCENARIO", "KVFORENSICS_DB")}


def install_copy(root: Path, work: Path) -> Path:
    """The prefix (a venv) holding ``root`` installed. Dependencies come from this venv through a .pth file, and
    the build uses its setuptools: no network. pip runs as the new venv's, so it installs there and leaves this
    environment's own kvforensics (the editable one) alone."""
    src = work / "src"
    src.mkdir()
    for name in SOURCES:
        path = root / name
        if path.is_dir():
            shutil.copytree(str(path), str(src / name), ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(str(path), str(src / name))
    pfx = work / "opt-kvforensics"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(pfx)], check=True)
    site = next(pfx.glob("lib/python3*/site-packages"))
    deps = next(p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir())
    (site / "test-deps.pth").write_text(deps + "\n")
    subprocess.run([str(pfx / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--no-index", str(src)], check=True, cwd=str(work), env=clean_env())
    return pfx
