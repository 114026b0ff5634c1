"""Persistence: the history database, record (cron), and the live watch view."""
