"""The probe's pynvml is cut to what collectors/nvml.py reaches (agent/remote/shake.py): the cut one must
answer every driver generation exactly as nvidia-ml-py's whole module does."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import types
from pathlib import Path

import pynvml
import pytest

from kvforensics.agent.remote import probe
from kvforensics.agent.remote.shake import shake
from kvforensics.collectors import nvml
from tests.fakenode import FAKE_LIB, ROOT, build_fake_nvml

SCENARIO = """driver 580.95.05
nvml 13.580.95.05
cuda 13000
gpu 0 uuid=GPU-0 name=NVIDIA_H200 bus=00000000:18:00.0 total=150754820096 reserved=1073741824 used=140000000000
gpu 1 uuid=GPU-1 name=NVIDIA_H200 bus=00000000:2A:00.0 total=150754820096 reserved=1073741824 used=100 mig=1
proc 0 compute 4242 139000000000
proc 0 graphics 4243 na
proc 1 compute 4244 1000
"""

# Every path of collectors/nvml.py the fake driver can take: process-list generations, the v1 memory call,
# a lost GPU, fields the driver refuses, and the init failures.
DIRECTIVES = ["", "process_api v2", "process_api v1", "process_api cc", "memory_api v1",
              "init driver_not_loaded", "init no_permission", "init rm_version_mismatch", "init unknown"]
EDITS = {"lost GPU": ("gpu 1 ", "gpu 1 state=lost "),
         "refused fields": ("gpu 1 ", "gpu 1 memory=no_permission processes=no_permission ")}

COLLECT = ("import json, sys; from kvforensics.collectors import nvml; "
           "print(json.dumps(nvml.collect(sys.argv[1]), sort_keys=True))")


def _collect(pynvml_dir: Path, scenario: Path) -> dict:
    env = {"PYTHONPATH": "{}:{}".format(pynvml_dir, ROOT), "FAKE_NVML_SCENARIO": str(scenario), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", COLLECT, str(FAKE_LIB)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def pynvml_dirs(tmp_path_factory):
    build_fake_nvml()
    whole = Path(pynvml.__file__).read_bytes()
    base = tmp_path_factory.mktemp("pynvml")
    (base / "whole").mkdir()
    (base / "whole" / "pynvml.py").write_bytes(whole)
    (base / "cut").mkdir()
    (base / "cut" / "pynvml.py").write_bytes(probe._shaken("pynvml.py", whole))  # exactly what the probe carries
    return base / "whole", base / "cut"


@pytest.mark.parametrize("edit", [("", "")] + [(d, "") for d in DIRECTIVES[1:]] + [("", e) for e in EDITS],
                         ids=lambda e: "".join(e) or "process_api v3")
def test_the_cut_pynvml_answers_as_the_whole_one(pynvml_dirs, tmp_path, edit):
    directive, which = edit
    text = SCENARIO if which == "" else SCENARIO.replace(*EDITS[which], 1)
    scenario = tmp_path / "scenario.txt"
    scenario.write_text(directive + "\n" + text)
    whole, cut = (_collect(d, scenario) for d in pynvml_dirs)
    assert cut == whole
    assert whole["status"] in ("ok", "partial", "failed", "absent")
    if directive == "":
        assert whole["gpus"][0]["processes"], whole  # the scenario reached the process lists


def test_the_cut_is_small_and_defines_every_name_used(monkeypatch):
    whole = Path(pynvml.__file__).read_bytes()
    cut = probe._shaken("pynvml.py", whole)
    assert len(cut) < len(whole) // 10 and cut.count(b"\n") == whole.count(b"\n")  # lines stay where they were
    module = types.ModuleType("pynvml_cut")
    monkeypatch.setitem(sys.modules, "pynvml_cut", module)  # pynvml finds itself in sys.modules at import
    exec(compile(cut, "pynvml.py", "exec"), module.__dict__)
    assert [n for n in nvml.PYNVML_USES if hasattr(pynvml, n) and not hasattr(module, n)] == []
    assert hasattr(module, "NVMLError_NotSupported")  # made at import from every NVML_ERROR_* constant


def test_every_pynvml_name_the_collector_reads_is_declared():
    tree = ast.parse(Path(nvml.__file__).read_text())
    read = {n.attr for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in ("nv", "pynvml")}
    assert read - set(nvml.PYNVML_USES) == set()
    # the process-list calls are looked up by built names: the declared ones must be pynvml's own
    assert all(hasattr(pynvml, n) for n in nvml._PROCESS_CALLS)


def test_shake_keeps_what_the_roots_reach_line_for_line():
    source = ('"""doc"""\nimport os\nA = 1\nB = A + 1\nC = 3\nNVML_ERROR_X = 9\n\n\n@staticmethod\ndef f():\n'
              '    return B\n\n\ndef g():\n    return C\n\n\nclass K(object):\n    x = os.sep\n\nprint(1); D = 4\n')
    out = shake(source, ["f", "K"], ("NVML_ERROR_",))
    assert out.count("\n") == source.count("\n")
    kept = [line for line in out.splitlines() if line]
    assert kept == ['"""doc"""', "import os", "A = 1", "B = A + 1", "NVML_ERROR_X = 9", "@staticmethod", "def f():",
                    "    return B", "class K(object):", "    x = os.sep", "print(1); D = 4"]
