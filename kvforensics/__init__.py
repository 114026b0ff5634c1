"""kvforensics: GPU-memory forensics for LLM inference servers.

The distribution's one import name. Its parts keep the repository's top level (pyproject.toml maps
them in): ``kvforensics.collectors`` is ``collectors/`` (what is observed; standard library only, and
shipped to inspected hosts as the probe), ``kvforensics.agent`` is ``agent/`` (the CLI, transports,
history and the forensics model), ``kvforensics.reports`` is ``reports/`` (the renderers).

Nothing else is imported here: the probe ships this package's name without its code, and every command
imports only what it uses.
"""

import os as _os

# Run from a source tree without installing it (its folder on sys.path: a bench comparing two checkouts, a
# test's subprocess): the parts are the folders beside this one. Installed, there is no pyproject.toml there.
_TREE = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_TREE, "pyproject.toml")) and _os.path.isdir(_os.path.join(_TREE, "agent")):
    __path__.append(_TREE)  # type: ignore[name-defined]  # noqa: F821 — a package's own __path__
