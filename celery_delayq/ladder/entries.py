"""The id of one pass through a delay backend (:data:`~celery_delayq.ladder.headers.ENTRY`).

A per-process 64-bit random prefix (drawn again in a forked child) and a count: 32 hex digits, as unique as
``uuid4().hex``, without a system call and an object per publish (it is made on every delayed publish).
"""

from __future__ import annotations

import itertools
import os

__all__ = ["new_entry"]

_PROCESS = [os.urandom(8).hex()]
_COUNT = itertools.count()
os.register_at_fork(after_in_child=lambda: _PROCESS.__setitem__(0, os.urandom(8).hex()))


def new_entry() -> str:
    """A new pass's entry id: 32 hex digits, unique across processes."""
    return f"{_PROCESS[0]}{next(_COUNT):016x}"
