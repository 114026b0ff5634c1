"""Architecture rules: collectors are a stdlib-only, Python 3.8 probe; data flows one way."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

STDLIB = set(getattr(sys, "stdlib_module_names", ())) | {"__future__"}
# nvidia-ml-py is the one non-stdlib module the probe may use: it is shipped with the probe.
BUNDLED = {"pynvml"}


def _modules(package: str):
    return sorted((ROOT / package).rglob("*.py"))


def _layer(module: str) -> str:
    """The top-level name a module is imported from; the project's own layers by their folder
    (``kvforensics.collectors.units`` → ``collectors``)."""
    parts = module.split(".")
    return parts[1] if parts[0] == "kvforensics" and len(parts) > 1 else parts[0]


def _imports(path: Path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield _layer(alias.name)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield _layer(node.module)


@pytest.mark.parametrize("path", _modules("collectors"), ids=lambda p: p.name)
def test_collectors_parse_as_python_3_8(path):
    ast.parse(path.read_text(encoding="utf-8"), feature_version=(3, 8))


@pytest.mark.skipif(not STDLIB, reason="sys.stdlib_module_names needs Python 3.10+")
@pytest.mark.parametrize("path", _modules("collectors"), ids=lambda p: p.name)
def test_collectors_import_only_the_standard_library(path):
    for name in _imports(path):
        assert name in STDLIB or name in BUNDLED or name == "collectors", "{} imports {}".format(path.name, name)


PURE_COLLECTORS = ("kvforensics.collectors.redact", "kvforensics.collectors.units", "kvforensics.collectors.registry")


@pytest.mark.parametrize("path", _modules("reports"), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_reports_do_not_collect(path):
    """Renderers may use pure helpers (redaction), never a collector that reads the machine."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kvforensics.collectors"):
            assert node.module in PURE_COLLECTORS, "{} imports {}".format(path.name, node.module)


@pytest.mark.parametrize("path", _modules("agent"), ids=lambda p: p.name)
def test_agent_does_not_import_reports_except_the_cli(path):
    """Only the edges that print (the CLI and the watch loop) may use renderers."""
    if path.relative_to(ROOT / "agent").as_posix().startswith("cli/") or path.name == "watch.py":
        return
    assert "reports" not in set(_imports(path)), path.name


ENGINE_PACKAGES = ("agent", "collectors", "reports")
ENGINES = sorted(p.name for p in (ROOT / "collectors").iterdir() if p.is_dir() and (p / "__init__.py").exists())


def _full_imports(path: Path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module


@pytest.mark.parametrize("engine", ENGINES)
def test_an_engine_folder_never_imports_another_engine(engine):
    """What engines share lives beside them (collectors/events.py, agent/model/citing.py), not inside one."""
    assert set(ENGINES) >= {"sglang", "vllm"}
    others = [e for e in ENGINES if e != engine]
    for package in ENGINE_PACKAGES:
        for path in sorted((ROOT / package / engine).rglob("*.py")):
            for module in _full_imports(path):
                parts = module.split(".")[1:] if module.startswith("kvforensics.") else module.split(".")
                assert not (len(parts) > 1 and parts[0] in ENGINE_PACKAGES and parts[1] in others), \
                    "{} imports {}".format(path.relative_to(ROOT), module)


def _raw_imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module


def test_every_module_is_imported_by_its_installed_name():
    """The wheel installs the folders under ``kvforensics`` only: ``import agent`` works from a checkout (the
    folder is on sys.path) and nowhere else, so no module, test or bench script may use it."""
    found = []
    for folder in ("kvforensics", "agent", "collectors", "reports", "tests", "bench", "examples"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "fixtures" in path.parts:
                continue
            found += ["{}: {}".format(path.relative_to(ROOT), m) for m in _raw_imports(path)
                      if m.split(".")[0] in ("agent", "collectors", "reports")]
    assert not found, "\n".join(found)
