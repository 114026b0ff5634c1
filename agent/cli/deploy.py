"""``kvforensics deploy-files`` and ``kvforensics schema``: what a deployment needs, from the installation."""

from __future__ import annotations

import os
import sys
from typing import Annotated, Optional

from kvforensics.agent.cli.options import UsageProblem
from kvforensics.agent.cli.params import Argument, Option


def deploy_files(
    folder: Annotated[Optional[str], Argument(help="Write the files into this folder.", metavar="DIR",
                                              show_default=False)] = None,
    show: Annotated[bool, Option("--print", help="Print the files instead of writing them.")] = False,
    binary: Annotated[Optional[str], Option("--bin", metavar="PATH",
                                            help="The kvforensics command the units and cron line run "
                                                 "(default: this installation's).")] = None,
    textfile_dir: Annotated[Optional[str], Option("--textfile-dir", metavar="DIR",
                                                  help="node_exporter's --collector.textfile.directory "
                                                       "(default: the running node_exporter's, else its "
                                                       "package's: /var/lib/prometheus/node-exporter on "
                                                       "Debian and Ubuntu, /var/lib/node_exporter/"
                                                       "textfile_collector elsewhere).")] = None,
    image: Annotated[Optional[str], Option("--image", metavar="REF",
                                           help="The image kubernetes/daemonset.yaml runs, as pushed to your "
                                                "registry (default kvforensics:VERSION).")] = None,
) -> None:
    """Write the cron line, systemd units, alert rules and their promtool tests, with this host's paths, the
    Kubernetes DaemonSet of serve (kubernetes/) and the Grafana dashboard (grafana/)."""
    from kvforensics.agent.cli import deploy_files as df
    from kvforensics.agent.cli import deploy_values as dv
    from kvforensics.agent.cli import trusted_paths as tp

    if (folder is None) == (not show):
        raise UsageProblem("name a folder to write the files into, or --print them")
    try:
        # a directory found is checked where it is found (find_textfile_dir); one given is checked here
        chosen = df.TextfileDir(dv.absolute_path(textfile_dir, "--textfile-dir"), "--textfile-dir") if textfile_dir \
            else df.find_textfile_dir()
        files = df.render(binary or df.installed_binary(), chosen.path, image)
    except dv.BadValue as exc:
        raise UsageProblem(str(exc)) from None
    except df.DeployFilesError as exc:
        raise UsageProblem(str(exc)) from None
    # Which directory, and why: on stderr with --print, whose stdout is the files themselves.
    said = "textfile directory {}: {}{}\n".format(chosen.path, chosen.why, "" if os.path.isdir(chosen.path) else (
        "; it does not exist here yet (install node_exporter first: record does not create it unless told "
        "to, --create-textfile-dir)"))
    if show:
        sys.stderr.write(said)
        for name, text in files.items():
            sys.stdout.write("# ==> {} <==\n{}\n".format(name, text))
        return
    try:
        real, written = df.write(folder, files)  # type: ignore[arg-type]
    except tp.UntrustedPath as exc:
        raise UsageProblem("{}: nothing written (deploy-files writes only into a folder that root or you own and no "
                           "one else can write, and follows only root's or your links)".format(
            dv.printable(str(exc)))) from None
    except OSError as exc:
        raise UsageProblem("{}: {}".format(dv.printable(str(exc.filename or folder)), exc.strerror or exc)) from None
    given = os.path.abspath(folder)  # type: ignore[arg-type]
    moved = "" if real == given else "{} is {} (through a link): ".format(dv.printable(given), dv.printable(real))
    sys.stdout.write("{}wrote {}\n{}".format(moved, ", ".join(dv.printable(w) for w in written), said))


def schema(
    name: Annotated[str, Argument(help="report, snapshot or history.", metavar="NAME", show_default=False)],
) -> None:
    """Print a published JSON Schema: report (kvforensics.report/1), snapshot or history."""
    import json

    from kvforensics.agent.model import evidence

    if name not in ("report", "snapshot", "history"):
        raise UsageProblem("schema NAME is report, snapshot or history")
    sys.stdout.write(json.dumps(evidence.schema(name), indent=2, ensure_ascii=False) + "\n")
