"""See the delayed work waiting in the ladder: ``celery_delayq.pending(app, ...)``.

* :mod:`.listing`: :func:`pending` itself: the index, less the cancelled tasks;
* :mod:`.browse`: a page of them, filtered, for the web page and the API.

The index and the cancel log themselves are read in :mod:`celery_delayq.index`.
"""

from __future__ import annotations

from .listing import pending

__all__ = ["pending"]
