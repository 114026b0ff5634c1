"""Engines are plug-ins: the neutral code names none, and a toy engine defined only in the tests is
read, analysed and reported through the same registries with no change to a neutral module."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Dict, Iterator, Set, Tuple

import pytest

from kvforensics.agent.plugin import ENGINES as MODELS
from kvforensics.collectors.plugin import ENGINES as COLLECTORS
from kvforensics.reports.plugin import VIEWS
from tests import toy_engine
from tests.conftest import ROOT, run_cli

LAYERS = ("agent", "collectors", "reports")
BUILT_IN = ("sglang", "trtllm", "vllm")


def _engine_folders() -> Set[str]:
    return {p.parent.name for layer in LAYERS for p in (ROOT / layer).glob("*/plugin.py")}


def _neutral_modules() -> Iterator[Path]:
    folders = _engine_folders()
    for layer in LAYERS:
        for path in sorted((ROOT / layer).rglob("*.py")):
            if not set(path.relative_to(ROOT).parts[1:-1]) & folders:
                yield path


def _docstrings(tree: ast.AST) -> Set[int]:
    out = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            out.add(id(body[0].value))
    return out


def _engine_names_in_code(path: Path, names: Tuple[str, ...]) -> Iterator[str]:
    """String constants (not docstrings), identifiers, attributes and imports that name an engine."""
    pattern = re.compile("|".join(names), re.IGNORECASE)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = _docstrings(tree)
    for node in ast.walk(tree):
        words = []
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            words.append(node.value)
        elif isinstance(node, ast.Name):
            words.append(node.id)
        elif isinstance(node, ast.Attribute):
            words.append(node.attr)
        elif isinstance(node, ast.alias):
            words += [node.name, node.asname or ""]
        elif isinstance(node, ast.ImportFrom):
            words.append(node.module or "")
        for word in words:
            if pattern.search(word):
                yield "{}:{}: {!r}".format(path.relative_to(ROOT), getattr(node, "lineno", "?"), word[:60])


def test_the_built_in_engines_are_found_by_their_folders_in_every_layer():
    assert set(BUILT_IN) <= _engine_folders()
    for registry in (COLLECTORS, MODELS, VIEWS):
        assert set(BUILT_IN) <= set(registry.names())


def test_no_engine_neutral_module_names_an_engine():
    names = tuple(sorted(_engine_folders()))
    found = [hit for path in _neutral_modules() for hit in _engine_names_in_code(path, names)]
    assert not found, "\n".join(found)


def _import_graph() -> Dict[str, Set[str]]:
    """Every static import between the project's modules, type-only imports included."""
    modules = {}
    for layer in LAYERS:
        for path in (ROOT / layer).rglob("*.py"):
            rel = path.relative_to(ROOT).with_suffix("")
            name = ".".join(("kvforensics",) + (rel.parts[:-1] if rel.name == "__init__" else rel.parts))
            modules[name] = path
    graph: Dict[str, Set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + ["{}.{}".format(node.module, a.name) for a in node.names]
            # A package that holds the importer is imported before it: no edge (``from kvforensics.agent.cli import x``
            # inside agent/cli/ names its sibling, not its own package's __init__).
            graph[name] |= {t for t in targets if t in modules and t != name and not name.startswith(t + ".")}
    return graph


def test_no_import_circle():
    graph = _import_graph()
    state: Dict[str, int] = {}

    def visit(node: str, path: Tuple[str, ...]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                pytest.fail("import circle: " + " → ".join(path[path.index(nxt):] + (node, nxt)))
            if nxt not in state:
                visit(nxt, path + (node,))
        state[node] = 2

    for start in sorted(graph):
        if start not in state:
            visit(start, ())


@pytest.fixture
def toy():
    toy_engine.register()
    try:
        yield toy_engine
    finally:
        toy_engine.unregister()


TOY_LOG = "booting\n[toyllm] kv cache 10.00 GiB for 40960 tokens, budget 12.50 GiB\nserving soon\n[toyllm] ready\n"


def test_a_toy_engine_is_analysed_and_reported_through_the_registries(toy, tmp_path):
    log = tmp_path / "toy.log"
    log.write_text(TOY_LOG)
    code, out, err = run_cli(["analyze", str(log), "--no-color", "--detail"])
    assert err == "" and code == 1  # its warning, at the default --fail-on warning
    assert "ToyLLM: KV cache 10.00 GiB of a 12.50 GiB budget" in out
    assert "ToyLLM's KV cache is 80% of its budget" in out
    code, out, err = run_cli(["analyze", str(log), "--no-color"])  # the one-screen report: its view's brief
    assert err == "" and "KV cache 10.00 GiB · budget 12.50 GiB" in out
    assert "WARNING  ToyLLM's KV cache is 80% of its budget" in out
    code, out, _ = run_cli(["analyze", str(log), "--json"])
    target = json.loads(out)["targets"][0]
    assert target["engine"]["name"] == "toyllm"
    assert [(f["code"], f["bytes"]) for f in target["findings"]] == [("toy_kv_share", 10 * (1 << 30))]


def test_the_toy_engine_is_chosen_by_name_and_its_absence_is_said(toy, tmp_path):
    log = tmp_path / "toy.log"
    log.write_text(TOY_LOG)
    code, out, err = run_cli(["analyze", str(log), "--engine-kind", "toyllm", "--json"])
    assert json.loads(out)["targets"][0]["engine"]["name"] == "toyllm"
    empty = tmp_path / "other.log"
    empty.write_text("nothing here\n")
    code, out, err = run_cli(["analyze", str(empty), "--engine-kind", "toyllm"])
    assert code == 2 and "no ToyLLM startup lines found (looked for 'kv cache')" in err


def test_an_unregistered_engine_is_a_usage_error_listing_the_registered_ones(tmp_path):
    log = tmp_path / "toy.log"
    log.write_text(TOY_LOG)
    code, out, err = run_cli(["analyze", str(log), "--engine-kind", "toyllm"])
    assert code == 2 and "toyllm" in err and all(name in err for name in BUILT_IN)


def test_a_bundle_naming_an_engine_without_a_plug_in_leaves_it_out_and_says_so(tmp_path):
    """A bundle from a kvforensics with more engines: the unknown server is left out, never read as another."""
    doc = json.loads((ROOT / "examples" / "vllm-node.json").read_text())
    doc["engines"]["engines"][0]["kind"] = "futurellm"
    bundle = tmp_path / "future.json"
    bundle.write_text(json.dumps(doc))
    code, out, err = run_cli(["inspect", "--from", str(bundle), "--json"])
    target = json.loads(out)["targets"][0]
    assert code in (0, 1) and "internal error" not in err
    assert target["engine"] is None or target["engine"]["name"] != "sglang"
    assert any(p["code"] == "engines.unknown_kind" and "futurellm" in p["message"] for p in target["problems"])
