"""deploy-files run by root against another local user (``nobody``, through ``setpriv``): what it writes can
land only where root or the caller chose, and holds no line or argument it did not mean to write.

Each case is an attack the security campaign made work before (README "Hostile input"): a process named
node_exporter with a newline in its flag, a link planted where a file will be written, a folder made first in
a shared /tmp, a link to /etc, values that split an argument or add a line."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                                reason="needs root and setpriv (another local user)")
NOBODY = 65534
EVIL = "/tmp/evil\n* * * * * root touch /kvf-pwned"


def as_nobody(argv, **kw) -> "subprocess.CompletedProcess[str]":
    return subprocess.run(["setpriv", "--reuid", str(NOBODY), "--regid", str(NOBODY), "--clear-groups", "--"] + argv,
                          capture_output=True, text=True, timeout=60, check=True, **kw)


@pytest.fixture()
def shared(tmp_path):
    """A sticky folder every user can write, like /tmp, in a folder of root's that others can traverse
    (pytest's own tmp_path is root's 0700)."""
    top = Path(tempfile.mkdtemp(prefix="kvf-hostile-", dir="/tmp"))
    top.chmod(0o755)
    folder = top / "tmp"
    folder.mkdir()
    folder.chmod(0o1777)
    yield folder
    shutil.rmtree(str(top), ignore_errors=True)


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "shadow"
    victim.write_text("root:secret\n")
    return victim


def test_a_folder_another_user_made_first_is_refused_and_its_planted_link_not_followed(shared, tmp_path):
    victim = _victim(tmp_path)
    as_nobody(["mkdir", str(shared / "kvf")])
    as_nobody(["ln", "-s", str(victim), str(shared / "kvf" / "kvforensics.cron")])
    code, out, err = run_cli(["deploy-files", str(shared / "kvf"), "--textfile-dir", "/srv/tf"])
    assert code == 2 and out == ""
    assert err.strip().endswith("{} belongs to uid 65534 (nobody): nothing written (deploy-files writes only into a "
                                "folder that root or you own and no one else can write, and follows only root's or "
                                "your links)".format(shared / "kvf")), err
    assert victim.read_text() == "root:secret\n" and len(err.strip().splitlines()) == 1


def test_another_users_link_to_etc_is_not_followed(shared, tmp_path):
    etc = tmp_path / "etc"
    etc.mkdir()
    as_nobody(["ln", "-s", str(etc), str(shared / "kvf")])
    code, out, err = run_cli(["deploy-files", str(shared / "kvf"), "--textfile-dir", "/srv/tf"])
    assert code == 2 and "{} is a link owned by uid 65534 (nobody): not followed".format(shared / "kvf") in err
    assert list(etc.iterdir()) == []


def test_roots_own_link_is_followed_and_said(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "via").symlink_to(real)
    code, out, err = run_cli(["deploy-files", str(tmp_path / "via"), "--textfile-dir", "/srv/tf"])
    assert code == 0, err
    assert out.startswith("{} is {} (through a link): wrote {}/kvforensics.cron, ".format(tmp_path / "via", real, real))
    assert (real / "kubernetes" / "daemonset.yaml").is_file()


@pytest.mark.parametrize("mode,word", [(0o777, "every user"), (0o775, "group")])
def test_a_folder_others_can_write_is_refused(tmp_path, mode, word):
    folder = tmp_path / "d"
    folder.mkdir()
    os.chown(str(folder), 0, NOBODY)
    folder.chmod(mode)
    code, out, err = run_cli(["deploy-files", str(folder), "--textfile-dir", "/srv/tf"])
    assert code == 2 and "{} is writable by {}".format(folder, word) in err and list(folder.iterdir()) == []


def test_links_and_other_users_files_inside_are_replaced_never_written_through(tmp_path):
    victim = _victim(tmp_path)
    folder = tmp_path / "d"
    folder.mkdir()
    (folder / "kvforensics.cron").symlink_to(victim)
    theirs = folder / "kvforensics-record.timer"
    theirs.write_text("old")
    os.chown(str(theirs), NOBODY, NOBODY)
    theirs.chmod(0o666)
    old = os.umask(0o000)  # the files' mode is 0644 whatever the umask
    try:
        code, out, err = run_cli(["deploy-files", str(folder), "--textfile-dir", "/srv/tf"])
    finally:
        os.umask(old)
    assert code == 0, err
    assert victim.read_text() == "root:secret\n"
    for name in ("kvforensics.cron", "kvforensics-record.timer", "kubernetes/daemonset.yaml"):
        st = (folder / name).lstat()
        assert (st.st_uid, oct(st.st_mode)) == (0, oct(0o100644)), name
    assert sorted(p.name for p in folder.iterdir() if p.name.startswith(".")) == []  # no temporaries left


def test_a_subfolder_that_is_a_link_stops_everything_before_a_file_is_written(tmp_path):
    folder = tmp_path / "d"
    folder.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (folder / "kubernetes").symlink_to(elsewhere)
    code, out, err = run_cli(["deploy-files", str(folder), "--textfile-dir", "/srv/tf"])
    assert code == 2 and "{} is a link or a file, not a folder".format(folder / "kubernetes") in err
    assert list(elsewhere.iterdir()) == [] and [p.name for p in folder.iterdir()] == ["kubernetes"]


@pytest.mark.parametrize("argv,message", [
    (["--textfile-dir", EVIL], "holds a control character (a newline would add a line)"),
    (["--textfile-dir", "srv/tf"], "is relative: cron and systemd run from /"),
    (["--textfile-dir", "/srv/tf", "--bin", "/opt/kvf/bin/kvforensics\nExecStartPre=/bin/sh"], "control character"),
    (["--textfile-dir", "/srv/tf", "--bin", "kvforensics"], "--bin kvforensics is relative"),
    (["--textfile-dir", "/srv/tf", "--image", "kvf:1\n          command: [sh]"], "is not an image reference"),
    (["--textfile-dir", "/srv/tf", "--image", "Registry/KVF:1"], "is not an image reference"),
])
def test_values_that_would_add_a_line_or_be_misread_are_refused(tmp_path, argv, message):
    code, out, err = run_cli(["deploy-files", str(tmp_path / "d")] + argv)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "d").exists()


def _cron_command(folder: Path) -> str:
    (line,) = [x for x in (folder / "kvforensics.cron").read_text().splitlines() if x and not x.startswith("#")]
    command = line.split(None, 6)[6]
    # what cron itself does before /bin/sh sees it (crontab(5)): an unescaped % ends the command, \% is %
    assert "%" not in command.replace("\\%", "")
    return command.replace("\\%", "%")


def test_paths_with_blanks_percent_quotes_and_dollars_reach_cron_and_systemd_as_one_word(tmp_path):
    tf, binary = "/srv/my tf/50%'s $HOME", "/opt/kv f/bin/kvforensics"
    code, out, err = run_cli(["deploy-files", str(tmp_path / "d"), "--textfile-dir", tf, "--bin", binary,
                              "--image", "registry.example:5000/ops/kvforensics:0.1.0@sha256:" + "a" * 64])
    assert code == 0, err
    words = shlex.split(_cron_command(tmp_path / "d"))  # as /bin/sh splits it
    assert words[0] == binary and words[words.index("--prom-file") + 1] == tf + "/kvforensics.prom"
    # and /bin/sh itself, not only shlex: the real shell gives the command these arguments
    shown = subprocess.run(["/bin/sh", "-c", _cron_command(tmp_path / "d").replace(
        shlex.quote(binary), "printf '%s\\n'", 1)], capture_output=True, text=True, check=True).stdout.splitlines()
    assert shown[-1] == tf + "/kvforensics.prom"
    unit = (tmp_path / "d" / "kvforensics-record.service").read_text()
    assert 'ExecStart="/opt/kv f/bin/kvforensics" record ' in unit
    assert '--prom-file "/srv/my tf/50%%\'s $$HOME/kvforensics.prom"' in unit
    assert 'ReadWritePaths=/var/lib/kvforensics "-/srv/my tf/50%%\'s $HOME"' in unit
    if shutil.which("systemd-analyze"):
        unit_dir = tmp_path / "units"
        unit_dir.mkdir()
        (unit_dir / "kvforensics-record.service").write_text(unit)
        done = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit_dir / "kvforensics-record.service")],
                              capture_output=True, text=True)
        assert "Invalid" not in done.stderr and "Failed to parse" not in done.stderr, done.stderr
    # the image's own entry point stays the image's: --bin is this host's path
    assert 'ENTRYPOINT ["/opt/kvforensics/bin/kvforensics"]' in (tmp_path / "d" / "kubernetes" / "Containerfile"
                                                                  ).read_text()


# --- a running "node_exporter" that is not one --------------------------------------------------

def _root_with(tmp_path: Path, pid: int) -> str:
    """A host root whose proc/ shows only ``pid`` (the real /proc entry), so that other exporters running
    on this machine do not count."""
    root = tmp_path / "root"
    (root / "proc").mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "etc" / "os-release").write_text("ID=debian\n")
    (root / "proc" / str(pid)).symlink_to("/proc/{}".format(pid))
    return str(root)


def _spawn(argv, user=NOBODY, argv0="node_exporter") -> "subprocess.Popen[bytes]":
    proc = subprocess.Popen(["setpriv", "--reuid", str(user), "--regid", str(user), "--clear-groups", "--",
                             "bash", "-c", 'exec -a "$0" "$@"', argv0] + argv, cwd="/",
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(500):  # until its /proc entry shows the exec'd command line (bounded: 5 s)
        try:
            if Path("/proc/{}/cmdline".format(proc.pid)).read_bytes().startswith(argv0.encode() + b"\0"):
                return proc
        except OSError:
            break
        time.sleep(0.01)
    return proc


def test_an_unprivileged_process_named_node_exporter_is_not_believed(tmp_path):
    from kvforensics.agent.cli import deploy_files as df

    proc = _spawn(["/bin/sh", "-c", "sleep 60; :", "sh", "--collector.textfile.directory=" + EVIL])
    try:
        found = df.find_textfile_dir(_root_with(tmp_path, proc.pid))
    finally:
        proc.kill()
        proc.wait()
    assert found.path == df.DEBIAN_TEXTFILE_DIR
    assert "ignored: PID {} named node_exporter (it runs {})".format(proc.pid, os.path.realpath("/bin/sh")) \
        in found.why, found.why


@pytest.mark.skipif(shutil.which("prometheus-node-exporter") is None,
                    reason="prometheus-node-exporter not installed (CI installs it)")
def test_the_packaged_exporter_started_by_another_user_or_a_copy_of_it_is_not_believed(tmp_path, shared):
    from kvforensics.agent.cli import deploy_files as df

    packaged = os.path.realpath(shutil.which("prometheus-node-exporter"))
    copy = shared / "node_exporter"
    shutil.copy(packaged, str(copy))
    os.chown(str(copy), NOBODY, NOBODY)
    flags = ["--collector.textfile.directory=/tmp/theirs", "--web.listen-address=127.0.0.1:0"]
    # the packaged binary run by another user; another user's copy of it run by root
    for exe, user, why in ((packaged, NOBODY, "run by uid 65534, not root or a system account"),
                           (str(copy), 0, "its binary: {} is not root's alone (uid 65534 (nobody)".format(copy))):
        proc = _spawn([exe] + flags, user, argv0=os.path.basename(exe))
        try:
            found = df.find_textfile_dir(_root_with(tmp_path / str(proc.pid), proc.pid))
        finally:
            proc.kill()
            proc.wait()
        assert found.path == df.DEBIAN_TEXTFILE_DIR and why in found.why, found.why


def test_a_newline_in_a_trusted_exporters_flag_is_refused_not_written(tmp_path):
    """Even root's own exporter (here a fake host's, root-owned) cannot put a second line into the cron file."""
    from kvforensics.agent.cli import deploy_files as df
    from tests.test_deploy import _fake_host

    root = _fake_host(tmp_path, "ID=debian\n", None, [(77, ["/usr/bin/node_exporter",
                                                            "--collector.textfile.directory=" + EVIL])])
    with pytest.raises(df.DeployFilesError, match="holds a control character .*: pass --textfile-dir"):
        df.find_textfile_dir(root)


def test_a_settings_file_another_user_can_write_is_not_read(tmp_path):
    from kvforensics.agent.cli import deploy_files as df
    from tests.test_deploy import _fake_host

    root = Path(_fake_host(tmp_path, "ID=debian\n", {"etc/default/prometheus-node-exporter":
                                                     "ARGS=--collector.textfile.directory=/tmp/theirs\n"}))
    (root / "etc" / "default" / "prometheus-node-exporter").chmod(0o666)
    found = df.find_textfile_dir(str(root))
    assert found.path == df.DEBIAN_TEXTFILE_DIR
    assert "ignored: /etc/default/prometheus-node-exporter (" in found.why and "mode 666" in found.why


def test_a_walk_that_ends_in_a_shared_folder_through_dotdot_is_refused(shared, tmp_path):
    """root's own link whose target climbs back into the sticky folder everyone writes ('x/..')."""
    (shared / "x").mkdir()
    (tmp_path / "via").symlink_to(str(shared / "x" / ".."))
    code, out, err = run_cli(["deploy-files", str(tmp_path / "via"), "--textfile-dir", "/srv/tf"])
    assert code == 2 and "{} is writable by every user (mode 1777)".format(shared) in err, err
    assert sorted(p.name for p in shared.iterdir()) == ["x"]
