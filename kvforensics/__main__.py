"""``python -m kvforensics`` runs the kvforensics CLI."""

from kvforensics.agent.cli import entry

entry()
