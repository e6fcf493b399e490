"""One object per process and key (publishers, parkers), safe across ``fork()``: a forked child calls
each one's ``after_fork_in_child()`` (no inherited locks or sockets) and it reconnects lazily."""

from __future__ import annotations

import os
import threading
from typing import Callable, Generic, Hashable, Iterator, Protocol, TypeVar

__all__ = ["ProcessRegistry", "ForkAware"]


class ForkAware(Protocol):
    """Something that can drop its parent-process resources in a forked child."""

    def after_fork_in_child(self) -> None: ...


T = TypeVar("T", bound=ForkAware)


class ProcessRegistry(Generic[T]):
    """A lazily filled ``key -> object`` map shared by the threads of one process."""

    def __init__(self) -> None:
        self._items: dict[Hashable, T] = {}
        self._lock = threading.Lock()
        os.register_at_fork(after_in_child=self._after_fork_in_child)

    def get(self, key: Hashable, factory: Callable[[], T]) -> T:
        """The object for ``key``, created by ``factory`` on first use."""
        with self._lock:
            item = self._items.get(key)
            if item is None:
                item = self._items[key] = factory()
            return item

    def values(self) -> Iterator[T]:
        """The objects created so far."""
        return iter(list(self._items.values()))

    def clear(self) -> None:
        """Forget every object (tests; they are not closed)."""
        with self._lock:
            self._items.clear()

    def _after_fork_in_child(self) -> None:
        self._lock = threading.Lock()
        for item in self._items.values():
            item.after_fork_in_child()
