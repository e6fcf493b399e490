"""Module for ``celery -A benchmarks.peers.workerapp worker``: the app comes from ``DQB_*`` env vars."""

from __future__ import annotations

from benchmarks.peers.apps import app_from_env

app = app_from_env()
