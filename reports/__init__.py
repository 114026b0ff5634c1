"""Renderers: pure functions from analysis records to text (terminal, JSON; later Prometheus).

Nothing here prints or reads; ``agent/cli.py`` writes what they return.
"""
