"""Reaching nodes: targets, SSH, the probe shipped to a host, fleets of hosts, saved bundles."""
