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
from tests.install import SOURCES, clean_env, install_copy

# A fake host's binaries and settings are trusted only when root owns them, as on a real host.
AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="root-owned fake binaries and settings need root")


@pytest.fixture(scope="module")
def prefix(tmp_path_factory) -> Path:
    """A README-style install: a venv of its own and `pip install` of a copy of this source (tests/install.py)."""
    return install_copy(ROOT, tmp_path_factory.mktemp("install"))


def test_deploy_files_come_from_the_installed_package(prefix, tmp_path):
    out = subprocess.run([str(prefix / "bin" / "kvforensics"), "deploy-files", str(tmp_path / "d"),
                          "--textfile-dir", "/var/lib/prometheus/node-exporter"], capture_output=True, text=True,
                         env=clean_env(), cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr
    cron = (tmp_path / "d" / "kvforensics.cron").read_text()
    # the installed entry point, and Debian's node_exporter textfile directory
    assert str(prefix / "bin" / "kvforensics") + " record" in cron
    assert "--prom-file /var/lib/prometheus/node-exporter/kvforensics.prom" in cron
    assert "/opt/kvforensics" not in (tmp_path / "d" / "kvforensics-record.service").read_text()
    # the Kubernetes files are data of the installed package too
    assert "kind: DaemonSet" in (tmp_path / "d" / "kubernetes" / "daemonset.yaml").read_text()
    assert (tmp_path / "d" / "kubernetes" / "Containerfile").is_file()
    assert '"uid": "kvforensics"' in (tmp_path / "d" / "grafana" / "kvforensics.json").read_text()


def test_the_exact_cron_line_refuses_a_missing_textfile_directory_then_writes_it(prefix, tmp_path):
    """The documented cron command, verbatim but for this prefix and a textfile directory that does not
    exist yet: record says so in one line (exit 2) rather than create a directory nothing reads; once
    node_exporter's directory is there, the same line writes the textfile."""
    build_fake_nvml()
    textfile_dir = tmp_path / "var" / "lib" / "node_exporter" / "textfile_collector"
    code, out, err = run_cli(["deploy-files", str(tmp_path / "d"), "--bin", str(prefix / "bin" / "kvforensics"),
                              "--textfile-dir", str(textfile_dir)])
    assert code == 0, err
    assert "textfile directory {}: --textfile-dir; it does not exist here yet".format(textfile_dir) in out
    line = next(x for x in (tmp_path / "d" / "kvforensics.cron").read_text().splitlines()
                if x and not x.startswith("#"))
    fields = line.split(None, 6)
    assert fields[5] == "root"
    command = fields[6].replace("--samples 6 --interval 20", "--samples 2 --interval 0")  # a quick run
    with FakeNode(tmp_path / "node") as node:
        env = dict(clean_env(), FAKE_NVML_SCENARIO=str(node.scenario), LD_LIBRARY_PATH=str(FAKE_LIB.parent),
                   KVFORENSICS_DB=str(tmp_path / "history.db"))
        refused = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, env=env, timeout=120)
        sampled = (tmp_path / "history.db").exists()
        textfile_dir.mkdir(parents=True)
        done = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, env=env, timeout=120)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "the directory {} does not exist".format(textfile_dir) in refused.stderr
    assert "--create-textfile-dir" in refused.stderr and not sampled  # refused before anything was sampled
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""  # --quiet: cron mails only failures
    text = (textfile_dir / "kvforensics.prom").read_text()
    assert "kvforensics_gpu_memory_free_bytes" in text and "kvforensics_last_success_timestamp_seconds" in text


def test_create_textfile_dir_creates_it(tmp_path, monkeypatch):
    build_fake_nvml()
    prom = tmp_path / "new" / "dir" / "kvforensics.prom"
    with FakeNode(tmp_path / "node") as node:
        monkeypatch.setenv("FAKE_NVML_SCENARIO", str(node.scenario))
        code, out, err = run_cli(["record", "--db", str(tmp_path / "h.db"), "--nvml-lib", str(FAKE_LIB), "--no-http",
                                  "--quiet", "--prom-file", str(prom), "--create-textfile-dir"])
    assert code == 0, err
    assert "kvforensics_gpu_up" in prom.read_text()


def test_the_textfile_directory_rewrites_commands_not_comments(tmp_path):
    """The cron file's comment names both packaged directories; --textfile-dir changes the command only."""
    template = (ROOT / "deploy" / "kvforensics.cron").read_text().splitlines()
    code, out, err = run_cli(["deploy-files", str(tmp_path), "--textfile-dir", "/srv/tf/", "--bin", "/x/kvf"])
    assert code == 0, err
    written = (tmp_path / "kvforensics.cron").read_text().splitlines()
    assert [x for x in written if x.startswith("#")] == [x for x in template if x.startswith("#")]
    assert "/var/lib/node_exporter/textfile_collector" in "\n".join(written)  # in the comment, as written
    (command,) = [x for x in written if x and not x.startswith("#")]
    assert command.endswith("--prom-file /srv/tf/kvforensics.prom") and " root /x/kvf record " in command


def _fake_host(tmp_path, os_release=None, settings=None, procs=()):
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "proc").mkdir()
    if os_release is not None:
        (root / "etc" / "os-release").write_text(os_release)
    for rel, text in (settings or {}).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    for pid, argv, *how in procs:
        _fake_process(root, pid, argv, **(how[0] if how else {}))
    return str(root)


def _fake_process(root, pid, argv, exe=None, uid=0):
    """A /proc entry: its command line, its binary (by default a root-owned file named as argv[0] in the fake
    host's /usr/bin) and its real uid."""
    entry = root / "proc" / str(pid)
    entry.mkdir()
    (entry / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    if exe is None:
        exe = root / "usr" / "bin" / os.path.basename(argv[0])
        exe.parent.mkdir(parents=True, exist_ok=True)
        exe.write_bytes(b"\x7fELF")
        exe.chmod(0o755)
    (entry / "exe").symlink_to(exe)
    (entry / "status").write_text("Name:\t{}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n".format(
        os.path.basename(argv[0])[:15], uid=uid))


DEBIAN = 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\n'
UBUNTU = 'NAME="Ubuntu"\nID=ubuntu\nID_LIKE=debian\n'
ROCKY = 'NAME="Rocky Linux"\nID="rocky"\nID_LIKE="rhel centos fedora"\n'


@pytest.mark.parametrize("os_release,settings,procs,want,why", [
    (DEBIAN, None, (), "/var/lib/prometheus/node-exporter", "Debian's and Ubuntu's prometheus-node-exporter"),
    (UBUNTU, None, (), "/var/lib/prometheus/node-exporter", "Debian's and Ubuntu's"),
    (ROCKY, None, (), "/var/lib/node_exporter/textfile_collector", "upstream's and RHEL's"),
    (None, None, (), "/var/lib/node_exporter/textfile_collector", "upstream's and RHEL's"),
    # the package's settings, when nothing runs: Debian's ARGS, RHEL's OPTIONS
    (DEBIAN, {"etc/default/prometheus-node-exporter": 'ARGS="--collector.textfile.directory /srv/a --web.x=1"\n'},
     (), "/srv/a", "of /etc/default/prometheus-node-exporter"),
    (ROCKY, {"etc/sysconfig/node_exporter": "OPTIONS=--collector.textfile.directory=/srv/b\n"}, (), "/srv/b",
     "of /etc/sysconfig/node_exporter"),
    (DEBIAN, {"etc/default/prometheus-node-exporter": 'ARGS=""\n'}, (), "/var/lib/prometheus/node-exporter",
     "Debian's"),
    # a running exporter wins: its flag, else its binary's default (Debian's has one)
    (DEBIAN, None, [(77, ["/usr/local/bin/node_exporter", "--collector.textfile.directory=/run/tf"])], "/run/tf",
     "the running node_exporter (PID 77) reads it"),
    (ROCKY, None, [(78, ["/usr/bin/prometheus-node-exporter", "--web.listen-address=:9100"])],
     "/var/lib/prometheus/node-exporter", "the running prometheus-node-exporter (PID 78) has no"),
    (DEBIAN, None, [(5, ["node_exporter", "--collector.textfile.directory", "/a"]),
                    (9, ["node_exporter", "--collector.textfile.directory", "/b"])], "/a", "1 more run (PIDs 9)"),
])
@AS_ROOT
def test_the_textfile_directory_node_exporter_reads(tmp_path, os_release, settings, procs, want, why):
    from kvforensics.agent.cli import deploy_files as df

    found = df.find_textfile_dir(_fake_host(tmp_path, os_release, settings, procs))
    assert found.path == want and why in found.why, found


@pytest.mark.parametrize("argv,message", [
    (["/opt/node_exporter/node_exporter"], "reads no textfiles: it was started without"),
    (["prometheus-node-exporter", "--no-collector.textfile"], "has its textfile collector off"),
])
@AS_ROOT
def test_a_running_exporter_that_reads_no_textfile_is_said(tmp_path, argv, message):
    from kvforensics.agent.cli import deploy_files as df

    with pytest.raises(df.DeployFilesError, match=message):
        df.find_textfile_dir(_fake_host(tmp_path, DEBIAN, None, [(40, argv)]))


@pytest.mark.skipif(shutil.which("prometheus-node-exporter") is None,
                    reason="prometheus-node-exporter not installed (CI installs it)")
def test_a_real_running_node_exporter_names_its_directory(tmp_path):
    """Debian's packaged binary, running: its own --collector.textfile.directory, read from its /proc entry
    (a root whose proc/ holds only that process, so other exporters on this machine do not count)."""
    from kvforensics.agent.cli import deploy_files as df

    textfiles = tmp_path / "textfiles"
    textfiles.mkdir()
    proc = subprocess.Popen(["prometheus-node-exporter", "--collector.textfile.directory={}".format(textfiles),
                             "--web.listen-address=127.0.0.1:0"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_listening(proc)  # its /proc entry shows its own command line only once it is running
        root = tmp_path / "root"
        (root / "proc").mkdir(parents=True)
        (root / "proc" / str(proc.pid)).symlink_to("/proc/{}".format(proc.pid))
        found = df.find_textfile_dir(str(root))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert found.path == str(textfiles)
    assert found.why.startswith("the running prometheus-node-exporter (PID {}) reads it".format(proc.pid))


def _wait_listening(proc: "subprocess.Popen[bytes]") -> None:
    """Until the exporter logs that it listens (a line at a time, so a dead exporter ends the wait at EOF)."""
    assert proc.stderr is not None
    for line in proc.stderr:
        if b"Listening on" in line:
            return
    raise AssertionError("prometheus-node-exporter exited before listening (exit {})".format(proc.wait()))


def _why_not_debian() -> str:
    from kvforensics.agent.cli import deploy_files as df

    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return "needs root and unshare (a private PID and mount namespace)"
    if shutil.which("prometheus-node-exporter") is None or not os.path.isdir(df.DEBIAN_TEXTFILE_DIR):
        return "Debian's prometheus-node-exporter is not installed (CI installs it)"
    if not df._debian_like("/"):
        return "not a Debian or Ubuntu host"
    return ""


@pytest.mark.skipif(bool(_why_not_debian()), reason=_why_not_debian() or "")
def test_on_debian_deploy_files_and_the_cron_line_feed_the_packaged_node_exporter(prefix, tmp_path):
    """With no path given: deploy-files names Debian's directory (from the OS, then from the running packaged
    exporter), the cron line it wrote writes the textfile there, and the packaged exporter serves it. In a
    private PID and mount namespace: the host's directory is never written, other exporters are not seen."""
    import json

    build_fake_nvml()
    textfiles, work = tmp_path / "textfiles", tmp_path / "work"
    textfiles.mkdir()
    work.mkdir()
    scenario = tmp_path / "scenario.txt"  # two GPUs, no engine: the node's own series
    scenario.write_text("driver 580.95.05\nnvml 13.580.95.05\ncuda 13000\n" + "".join(
        "gpu {0} uuid=GPU-deb{0} name=NVIDIA_H100 bus=00000000:{1:02X}:00.0 total=85899345920 reserved=536870912 "
        "used=1073741824 free=84289404928\n".format(i, 0x18 + i) for i in range(2)))
    env = dict(clean_env(), FAKE_NVML_SCENARIO=str(scenario), LD_LIBRARY_PATH=str(FAKE_LIB.parent),
               KVFORENSICS_DB=str(tmp_path / "history.db"), PYTHONPATH=str(ROOT))
    done = subprocess.run(["unshare", "--mount", "--pid", "--fork", "--mount-proc", "--propagation", "private",
                           sys.executable, "-m", "tests.debian_node", str(prefix / "bin" / "kvforensics"),
                           str(textfiles), str(work)], capture_output=True, text=True, env=env, cwd=str(ROOT),
                          timeout=600)
    if done.returncode != 0 and "unshare failed" in done.stderr:
        pytest.skip("no private namespaces here: " + done.stderr.strip()[:200])
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert "textfile directory /var/lib/prometheus/node-exporter: the default of Debian's and Ubuntu's " \
           "prometheus-node-exporter package" in out["before"], out["before"]
    assert "textfile directory /var/lib/prometheus/node-exporter: the running prometheus-node-exporter (PID {}) has " \
           "no --collector.textfile.directory: its package's default".format(out["exporter_pid"]) in out["after"]
    assert out["cron"]["command"].endswith("--prom-file /var/lib/prometheus/node-exporter/kvforensics.prom")
    assert out["cron"]["code"] == 0 and out["cron"]["stdout"] == "", out["cron"]
    assert out["files"] == ["kvforensics.prom"] and (textfiles / "kvforensics.prom").is_file()
    scrape = out["scrape"]
    assert 'kvforensics_gpu_memory_free_bytes{' in scrape and "kvforensics_last_success_timestamp_seconds" in scrape
    assert "node_textfile_scrape_error 0" in scrape


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_units_pass_systemds_verifier(tmp_path):
    code, out, err = run_cli(["deploy-files", str(tmp_path), "--bin", "/bin/true", "--textfile-dir",
                              str(tmp_path / "tf")])
    assert code == 0, err
    done = subprocess.run(["systemd-analyze", "verify", "--man=no", str(tmp_path / "kvforensics-record.service"),
                           str(tmp_path / "kvforensics-record.timer")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    service = (tmp_path / "kvforensics-record.service").read_text()
    # the textfile directory is not created by the unit ('-': the unit starts without it, record says so)
    assert "ReadWritePaths=/var/lib/kvforensics -{}\n".format(tmp_path / "tf") in service
    assert "mkdir" not in service


# The alert scenarios (README "Alerts"): each is a test group of deploy/kvforensics.rules.test.yml.
SCENARIOS = ("healthy", "unused", "low headroom", "lost GPU", "NVML missing", "engine down", "restart", "vLLM",
             "log rotation", "collected nothing", "textfile stale")


def _rules_and_tests():
    import yaml

    folder = ROOT / "deploy"
    alerts = [r["alert"] for g in yaml.safe_load((folder / "kvforensics.rules.yml").read_text())["groups"]
              for r in g["rules"]]
    return alerts, yaml.safe_load((folder / "kvforensics.rules.test.yml").read_text())["tests"]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (CI installs prometheus)")
def test_every_alert_passes_its_promtool_unit_tests():
    folder = ROOT / "deploy"
    check = subprocess.run(["promtool", "check", "rules", "kvforensics.rules.yml"], cwd=str(folder),
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    done = subprocess.run(["promtool", "test", "rules", "kvforensics.rules.test.yml"], cwd=str(folder),
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_scenario_checks_every_alert():
    """The scenario table: each scenario is one test group, and each group says, for every alert, whether
    it fires (an alert_rule_test per alert at the scenario's steady time)."""
    alerts, tests = _rules_and_tests()
    assert [t["name"] for t in tests] == list(SCENARIOS)
    for t in tests:
        assert {c["alertname"] for c in t["alert_rule_test"]} == set(alerts), t["name"]
        steady = t["alert_rule_test"][-len(alerts):]
        assert [c["alertname"] for c in steady] == alerts and len({c["eval_time"] for c in steady}) == 1, t["name"]
    fired = {t["name"]: sorted(c["alertname"] for c in t["alert_rule_test"][-len(alerts):] if c["exp_alerts"])
             for t in tests}
    assert fired["healthy"] == [] and fired["restart"] == ["KvforensicsUnusedGpuMemory"]
    assert fired["engine down"] == ["KvforensicsEngineDown"] and fired["log rotation"] == [
        "KvforensicsUnusedGpuMemory"]
    # the unused and low-water alerts never fire together for one engine, at any time a scenario checks
    for t in tests:
        at: dict = {}
        for c in t["alert_rule_test"]:
            for a in c["exp_alerts"]:
                at.setdefault((c["eval_time"], a["exp_labels"].get("engine")), set()).add(c["alertname"])
        assert not [k for k, v in at.items() if {"KvforensicsUnusedGpuMemory", "KvforensicsLowWaterBelowMargin"} <= v]


def test_the_scenarios_series_are_what_kvforensics_exports():
    """Every input series of the scenarios is a metric kvforensics (or node_exporter's textfile collector)
    exports, with label names it exports (plus the scrape's instance and job)."""
    import json
    import re

    from prometheus_client.parser import text_string_to_metric_families

    from kvforensics.agent.history.store import GpuLowWater
    from kvforensics.agent.model.reconcile import inspect_snapshot
    from kvforensics.agent.model.records import Options
    from kvforensics.reports import prometheus

    insp = inspect_snapshot(json.loads((ROOT / "examples" / "seed-node.json").read_text()), "local:n1", Options())
    lows = {g.index: GpuLowWater(gpu=g.index, uuid=g.uuid, rank=g.rank, samples=1, min_free_bytes=g.free_bytes,
                                 max_free_bytes=g.free_bytes, last_free_bytes=g.free_bytes, min_free_at=1.0)
            for g in insp.gpus}
    engine = prometheus.EngineSeries(inspection=insp, low_water=lows, samples=1,
                                     run_min={g.index: g.free_bytes for g in insp.gpus if g.free_bytes is not None})
    node = prometheus.NodeSeries(engines=(engine,), gone=((("engine", "vllm-8000"),),), last_success=1.0)
    exported = {"node_textfile_mtime_seconds": {"file"}}
    for fam in text_string_to_metric_families(prometheus.render(prometheus.registry(node))):
        for sample in fam.samples:
            exported.setdefault(sample.name, set()).update(sample.labels)
    assert {"kvforensics_engine_unused_bytes", "kvforensics_gpu_memory_free_min_bytes"} <= set(exported)
    _, tests = _rules_and_tests()
    for t in tests:
        for s in t["input_series"]:
            name, labels = re.match(r"^(\w+)\{(.*)\}$", s["series"]).groups()
            keys = set(re.findall(r"(\w+)=\"", labels))
            assert name in exported, (t["name"], name)
            assert keys - {"instance", "job"} <= exported[name], (t["name"], name, keys - exported[name])


def test_deploy_files_usage():
    assert run_cli(["deploy-files"])[0] == 2
    code, out, err = run_cli(["deploy-files", "--print"])
    assert code == 0 and "# ==> kvforensics.rules.yml <==" in out


def test_the_install_owns_one_import_name(prefix, tmp_path):
    """pip puts kvforensics and its metadata into site-packages, nothing else (no top-level ``agent`` or
    ``reports`` beside other projects' modules), and ``python -m kvforensics`` runs the CLI from there."""
    site = next(prefix.glob("lib/python3*/site-packages"))
    ours = sorted(p.name for p in site.iterdir() if p.name != "test-deps.pth" and not p.name.startswith("_"))
    assert [n for n in ours if not n.endswith(".dist-info")] == ["kvforensics"]
    assert {p.name for p in (site / "kvforensics").iterdir() if p.is_dir()} >= {"agent", "collectors", "reports"}
    assert (site / "kvforensics" / "agent" / "schemas" / "report.schema.json").is_file()
    out = subprocess.run([str(prefix / "bin" / "python"), "-m", "kvforensics", "--version"], capture_output=True,
                         text=True, env=clean_env(), cwd=str(tmp_path))
    assert out.returncode == 0 and out.stdout.startswith("kvforensics "), out.stderr
    code = ("import kvforensics.agent.cli, sys\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'agent', 'collectors', 'reports'}))")
    out = subprocess.run([str(prefix / "bin" / "python"), "-c", code], capture_output=True, text=True,
                         env=clean_env(), cwd=str(tmp_path))
    assert out.stdout.strip() == "[]", out.stderr


def test_pyproject_names_every_package_folder():
    """The folders are installed under another name, so their packages are listed in pyproject.toml by hand: a
    new engine's folder missing there would be missing from the wheel."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    tree = {"kvforensics"} | {"kvforensics." + ".".join(p.parent.relative_to(ROOT).parts)
                              for top in ("agent", "collectors", "reports") for p in (ROOT / top).rglob("__init__.py")}
    data = set(setuptools["package-data"])  # folders of data alone (the schemas): packages to setuptools too
    assert listed == tree | data


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
                   "deploy/kubernetes/Containerfile", "deploy/grafana/kvforensics.json"):
        assert needed in names, needed
    assert not any(n.endswith((".so", ".so.1", ".pyc")) for n in names)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (CI installs prometheus)")
def test_the_documented_dcgm_join_labels_its_series_with_the_engine(tmp_path):
    """README's join of dcgm-exporter's series with ours (on its UUID), run by promtool on series shaped as
    dcgm-exporter's and ours."""
    import re

    import yaml

    readme = (ROOT / "docs" / "cron-prometheus-alerts.md").read_text()
    expr = re.search(r"`(DCGM_FI_DEV_GPU_UTIL \* on\(UUID\)[^`]+)`", readme).group(1)
    dcgm = ('DCGM_FI_DEV_GPU_UTIL{{gpu="{0}", UUID="GPU-{0}", pci_bus_id="00000000:1{0}:00.0", '
            'modelName="NVIDIA H100 80GB HBM3", Hostname="gpu-07", instance="10.0.0.5:9400"}}')
    ours = ('kvforensics_gpu_memory_free_low_water_bytes{{gpu="{0}", uuid="GPU-{0}", pci_bus_id="00000000:1{0}:00.0", '
            'gpu_model="NVIDIA H100 80GB HBM3", engine="sglang-30000", rank="TP{0}", instance="gpu-07:9100"}}')
    doc = {"rule_files": [], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [{"series": dcgm.format(i), "values": "{}x5".format(50 + i)} for i in range(2)]
        + [{"series": ours.format(i), "values": "5368709120x5"} for i in range(2)],
        "promql_expr_test": [{"expr": expr, "eval_time": "2m", "exp_samples": [
            {"labels": '{{gpu="{0}", UUID="GPU-{0}", pci_bus_id="00000000:1{0}:00.0", '
                       'modelName="NVIDIA H100 80GB HBM3", Hostname="gpu-07", instance="10.0.0.5:9400", '
                       'engine="sglang-30000", rank="TP{0}"}}'.format(i), "value": 50 + i} for i in range(2)]}]}]}
    (tmp_path / "join.test.yml").write_text(yaml.safe_dump(doc))
    done = subprocess.run(["promtool", "test", "rules", "join.test.yml"], cwd=str(tmp_path), capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stdout + done.stderr
