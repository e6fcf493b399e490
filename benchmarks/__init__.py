"""Benchmarks of celery_delayq against Celery's native delayed delivery, classic ETA and a naive TTL queue.

Run ``python benchmarks/run.py --quick`` (or ``--full``); see ``benchmarks/README.md``.
"""
