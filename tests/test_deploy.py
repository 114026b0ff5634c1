"""Deployment as documented: a real install into a fresh prefix, `kvforensics deploy-files` from it,
the exact cron line run against a fake node, systemd's own verifier on the units, and promtool's
unit tests for every alert rule."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli
from tests.fakenode import FAKE_LIB, FakeNode, build_fake_nvml

SOURCES = ("pyproject.toml", "README.md", "LICENSE", "agent", "collectors", "reports", "deploy")


@pytest.fixture(scope="module")
def prefix(tmp_path_factory) -> Path:
    """A README-style install: a venv of its own and `pip install` of this source (copied first, so
    the build leaves nothing in the checkout). Dependencies come from the test venv through a .pth
    file, and the build uses its setuptools: no network."""
    work = tmp_path_factory.mktemp("install")
    src = work / "src"
    src.mkdir()
    for name in SOURCES:
        path = ROOT / name
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
                    "--no-index", str(src)], check=True, cwd=str(work), env=_clean_env())
    return pfx


def _clean_env() -> dict:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FAKE_NVML_SCENARIO", "KVFORENSICS_DB")}


def test_deploy_files_come_from_the_installed_package(prefix, tmp_path):
    out = subprocess.run([str(prefix / "bin" / "kvforensics"), "deploy-files", str(tmp_path / "d"),
                          "--textfile-dir", "/var/lib/prometheus/node-exporter"], capture_output=True, text=True,
                         env=_clean_env(), cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr
    cron = (tmp_path / "d" / "kvforensics.cron").read_text()
    # the installed entry point, and Debian's node_exporter textfile directory
    assert str(prefix / "bin" / "kvforensics") + " record" in cron
    assert "--prom-file /var/lib/prometheus/node-exporter/kvforensics.prom" in cron
    assert "/opt/kvforensics" not in (tmp_path / "d" / "kvforensics-record.service").read_text()
    # the Kubernetes files are data of the installed package too
    assert "kind: DaemonSet" in (tmp_path / "d" / "kubernetes" / "daemonset.yaml").read_text()
    assert (tmp_path / "d" / "kubernetes" / "Containerfile").is_file()


def test_the_exact_cron_line_writes_the_textfile_on_a_fresh_node(prefix, tmp_path):
    """The documented cron command, verbatim but for this prefix and a textfile directory that does
    not exist yet (nothing creates it on a fresh node: record must)."""
    build_fake_nvml()
    textfile_dir = tmp_path / "var" / "lib" / "node_exporter" / "textfile_collector"
    code, out, err = run_cli(["deploy-files", str(tmp_path / "d"), "--bin", str(prefix / "bin" / "kvforensics"),
                              "--textfile-dir", str(textfile_dir)])
    assert code == 0, err
    line = next(x for x in (tmp_path / "d" / "kvforensics.cron").read_text().splitlines()
                if x and not x.startswith("#"))
    fields = line.split(None, 6)
    assert fields[5] == "root"
    command = fields[6].replace("--samples 6 --interval 20", "--samples 2 --interval 0")  # a quick run
    with FakeNode(tmp_path / "node") as node:
        env = dict(_clean_env(), FAKE_NVML_SCENARIO=str(node.scenario), LD_LIBRARY_PATH=str(FAKE_LIB.parent),
                   KVFORENSICS_DB=str(tmp_path / "history.db"))
        done = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""  # --quiet: cron mails only failures
    text = (textfile_dir / "kvforensics.prom").read_text()
    assert "kvforensics_gpu_memory_free_bytes" in text and "kvforensics_last_success_timestamp_seconds" in text


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_units_pass_systemds_verifier(tmp_path):
    code, out, err = run_cli(["deploy-files", str(tmp_path), "--bin", "/bin/true", "--textfile-dir",
                              str(tmp_path / "tf")])
    assert code == 0, err
    done = subprocess.run(["systemd-analyze", "verify", "--man=no", str(tmp_path / "kvforensics-record.service"),
                           str(tmp_path / "kvforensics-record.timer")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    service = (tmp_path / "kvforensics-record.service").read_text()
    # the textfile directory exists before the sandbox that lists it is built (else 226/NAMESPACE)
    assert "ExecStartPre=+/bin/mkdir -p {}".format(tmp_path / "tf") in service


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (CI installs prometheus)")
def test_every_alert_has_a_promtool_unit_test():
    import yaml

    folder = ROOT / "deploy"
    check = subprocess.run(["promtool", "check", "rules", "kvforensics.rules.yml"], cwd=str(folder),
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    done = subprocess.run(["promtool", "test", "rules", "kvforensics.rules.test.yml"], cwd=str(folder),
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    alerts = {r["alert"] for g in yaml.safe_load((folder / "kvforensics.rules.yml").read_text())["groups"]
              for r in g["rules"]}
    tested = {t["alertname"] for case in yaml.safe_load((folder / "kvforensics.rules.test.yml").read_text())["tests"]
              for t in case["alert_rule_test"]}
    assert alerts == tested


def test_deploy_files_usage():
    assert run_cli(["deploy-files"])[0] == 2
    code, out, err = run_cli(["deploy-files", "--print"])
    assert code == 0 and "# ==> kvforensics.rules.yml <==" in out


def test_the_sdist_holds_what_the_tests_need(tmp_path):
    """A source distribution built from this tree carries the tests with their conftest, fixtures
    and the fake driver's source, the schemas and the deployment files."""
    import tarfile

    src = tmp_path / "src"
    src.mkdir()
    for name in SOURCES + ("MANIFEST.in", "Makefile", "tests", "examples", "bench", ".ci"):
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(str(path), str(src / name), ignore=shutil.ignore_patterns("__pycache__", "build"))
        else:
            shutil.copy(str(path), str(src / name))
    out = tmp_path / "dist"
    code = "from setuptools import build_meta; print(build_meta.build_sdist({!r}))".format(str(out))
    done = subprocess.run([sys.executable, "-c", code], cwd=str(src), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    with tarfile.open(str(out / done.stdout.strip().splitlines()[-1])) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for needed in ("tests/conftest.py", "tests/fake_nvml/fake_nvml.c", "tests/fixtures/line_formats.txt",
                   "tests/fixtures/real_sglang/README.md", "tests/conformance/test_sglang_eras.py",
                   "agent/schemas/report.schema.json", "deploy/kvforensics.rules.test.yml", "LICENSE", "Makefile",
                   "examples/seed-node.json", ".ci/run", "deploy/kubernetes/daemonset.yaml",
                   "deploy/kubernetes/Containerfile"):
        assert needed in names, needed
    assert not any(n.endswith((".so", ".so.1", ".pyc")) for n in names)
