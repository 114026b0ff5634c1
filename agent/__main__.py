"""``python -m agent`` runs the kvforensics CLI."""

from agent.cli import entry

entry()
