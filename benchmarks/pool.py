"""A pool of long-lived benchmark child processes with a start barrier.

Each child is ``python -m benchmarks.child`` speaking JSON lines on
stdin/stdout. A job is sent to several children; each sets up (connects,
declares, warms up) and answers ``ready``; only when all are ready does the
parent send ``go`` to every one of them, so "8 processes" means 8 processes
publishing at the same time, and set-up never counts as publishing time.

Children are separate interpreters rather than forks, so a baseline job never
runs in a process that imported celery_delayq (whose import swaps kombu's
producer class) unless an earlier job in that child did.
"""

from __future__ import annotations

import contextlib
import json
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Sequence

from .common import TMP_DIR, child_env


class ChildError(RuntimeError):
    """A child reported an exception (its traceback is in the message)."""


class Child:
    """One ``benchmarks.child`` process and a reader thread for its answers."""

    def __init__(self, index: int, log_dir: Path, pure: bool = False) -> None:
        self.index, self.pure = index, pure
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"child-{index}.log"
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen([sys.executable, "-m", "benchmarks.child"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._log, env=child_env(**({"DQB_PURE": "1"} if pure else {})),
                                     bufsize=0)
        self.answers: "queue.Queue[dict[str, Any]]" = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with contextlib.suppress(ValueError):
                self.answers.put(json.loads(line))
        self.answers.put({"error": f"child {self.index} exited (code {self.proc.poll()}); see {self.log_path}"})

    def send(self, obj: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(obj) + "\n").encode())
        self.proc.stdin.flush()

    def recv(self, timeout: float) -> dict[str, Any]:
        try:
            msg = self.answers.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"child {self.index} did not answer within {timeout:.0f} s; see {self.log_path}") from None
        if "error" in msg:
            raise ChildError(f"child {self.index}: {msg['error']}")
        return msg

    def restart(self) -> None:
        """Kill this child (it is stuck or out of step) and start a fresh one."""
        with contextlib.suppress(Exception):
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._log.close()
        self.__init__(self.index, self.log_path.parent, self.pure)  # type: ignore[misc]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.send({"op": "exit"})
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._log.close()


class Running:
    """Jobs started on some children: ready barrier passed, ``go`` not yet sent or sent."""

    def __init__(self, children: Sequence[Child]) -> None:
        self.children = list(children)
        self.go_at: float | None = None

    def go(self) -> float:
        """Release every child at once; returns the release time (epoch)."""
        self.go_at = time.time()
        for c in self.children:
            c.send({"op": "go", "at": self.go_at})
        return self.go_at

    def send(self, i: int, obj: dict[str, Any]) -> None:
        self.children[i].send(obj)

    def result(self, i: int, timeout: float) -> dict[str, Any]:
        return self.children[i].recv(timeout)["result"]

    def results(self, timeout: float, members: Sequence[int] | None = None) -> list[dict[str, Any]]:
        """Every member's result; all are collected before the first failure is raised,
        and a child that timed out is restarted, so no stale answer leaks into the next job."""
        deadline = time.monotonic() + timeout
        out: list[dict[str, Any]] = []
        first: Exception | None = None
        for i in members if members is not None else range(len(self.children)):
            try:
                out.append(self.result(i, max(1.0, deadline - time.monotonic())))
            except TimeoutError as exc:
                self.children[i].restart()
                first = first or exc
            except ChildError as exc:
                first = first or exc
        if first is not None:
            raise first
        return out


class ChildPool:
    """``size`` children, reused by every scenario of a run.

    ``pure`` children never import celery_delayq (for Celery's own reference rates);
    the others import it first thing, as an application does.
    """

    def __init__(self, size: int, log_dir: Path | None = None, *, pure: bool = False) -> None:
        sub = "children-pure" if pure else "children"
        self.children = [Child(i, log_dir or TMP_DIR / sub, pure) for i in range(size)]

    def start(self, jobs: Sequence[dict[str, Any]], ready_timeout: float = 120.0) -> Running:
        """Send ``jobs[i]`` to child ``i`` and wait until all are ready (the barrier)."""
        if len(jobs) > len(self.children):
            raise ValueError(f"{len(jobs)} jobs for a pool of {len(self.children)}")
        chosen = self.children[: len(jobs)]
        for child, job in zip(chosen, jobs, strict=True):
            child.send({"op": "job", "job": job})
        deadline = time.monotonic() + ready_timeout
        failure: Exception | None = None
        ready: list[Child] = []
        for child in chosen:
            try:
                msg = child.recv(max(1.0, deadline - time.monotonic()))
                if not msg.get("ready"):
                    raise ChildError(f"child {child.index} answered {msg} instead of ready")
                ready.append(child)
            except TimeoutError as exc:
                child.restart()
                failure = failure or exc
            except ChildError as exc:
                failure = failure or exc
        if failure is not None:
            for child in ready:  # release the others from the barrier without running
                child.send({"op": "abort"})
                with contextlib.suppress(Exception):
                    child.recv(30.0)
            raise failure
        return Running(chosen)

    def run(self, jobs: Sequence[dict[str, Any]], timeout: float = 600.0) -> list[dict[str, Any]]:
        """Start ``jobs`` together (barrier), release them, and collect their results."""
        running = self.start(jobs)
        running.go()
        return running.results(timeout)

    def close(self) -> None:
        for c in self.children:
            c.close()

    def __enter__(self) -> "ChildPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
