"""``kvforensics probe -o FILE``: write the exact probe that ``inspect HOST`` ships, for review."""

from __future__ import annotations

import sys
from typing import Annotated

from kvforensics.agent.cli.options import UsageProblem
from kvforensics.agent.cli.params import Option


def probe(
    output: Annotated[str, Option("--output", "-o", help="Where to write the probe script.")],
) -> None:
    """Write the probe script that `inspect HOST` sends on stdin to `python3 -I -`, for review or a manual run."""
    from kvforensics.agent.remote import probe as probe_mod

    try:
        sha, size = probe_mod.write(output)
    except OSError as exc:
        raise UsageProblem("--output {}: {}".format(output, exc.strerror or exc)) from None
    sys.stdout.write("wrote {} ({:,} bytes; code sha256 {}); run it by hand with: python3 -I - < {}\n".format(
        output, size, sha, output))
