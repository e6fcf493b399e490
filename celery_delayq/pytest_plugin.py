"""pytest plugin: ``delayq_enabled`` alone works in a test suite's Celery apps and workers too.

In production the ``celery`` command loads celery_delayq through its ``celery.commands``
entry point, so a worker of an app with ``delayq_enabled = True`` runs the ladder even
when the app's module never imports it. Celery's in-thread test worker
(``celery.contrib.testing.worker``, the ``celery_worker`` fixture) is started without
that command: there nothing imported celery_delayq, and delayed tasks were held in the
worker's memory (classic ETA) without a word. pytest loads this plugin through its
``pytest11`` entry point, before any test module or conftest builds an app; importing
the package registers the Celery fixup that reads the setting on every app.

Turn it off with ``-p no:celery_delayq``.
"""

from __future__ import annotations

import celery_delayq  # noqa: F401  (registers the fixup that installs the ladder where delayq_enabled is on)

__all__: list[str] = []
