"""Entry ids (pure): the id of every pass, unique without a system call per publish."""

from __future__ import annotations

import os
import re

from celery_delayq.ladder.entries import new_entry


def test_entry_ids_are_32_hex_digits_and_never_repeat() -> None:
    ids = [new_entry() for _ in range(10_000)]
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    assert len(set(ids)) == len(ids)


def test_a_forked_child_draws_ids_of_its_own() -> None:
    parent = new_entry()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id, to the parent
        try:
            os.write(write, new_entry().encode())
        finally:
            os._exit(0)
    os.close(write)
    child = os.read(read, 64).decode()
    os.close(read)
    os.waitpid(pid, 0)
    after = new_entry()
    # The child counts on from the parent's count, but under 64 random bits of its own: no id in common.
    assert child[:16] != parent[:16] and after[:16] == parent[:16]
    assert child not in {parent, after}
