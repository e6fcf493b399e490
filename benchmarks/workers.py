"""Real Celery worker subprocesses (``celery -A benchmarks.peers.workerapp worker --pool=solo``).

The worker runs the ``dqbench.record`` task, which appends
``seq due arrival hops`` to a record file; the parent reads that file for
lateness and samples the worker's RSS with psutil. Only processes started
here are ever signalled, by their own pid.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

from .common import TMP_DIR, child_env, connect, rss_mb


class CeleryWorker:
    """One solo-pool Celery worker for a system of :mod:`benchmarks.peers.apps`."""

    def __init__(self, system: str, vhost: str, url: str, queue: str, *, label: str,
                 opts: dict[str, Any] | None = None, prefetch: int = 64) -> None:
        self.system, self.vhost, self.url, self.queue, self.label = system, vhost, url, queue, label
        self.opts = dict(opts or {}, prefetch=prefetch)
        run_id = uuid.uuid4().hex[:6]
        TMP_DIR.mkdir(parents=True, exist_ok=True)
        self.record_path = TMP_DIR / f"worker-{label}-{run_id}.records"
        self.log_path = TMP_DIR / f"worker-{label}-{run_id}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    def start(self, timeout: float = 90.0) -> "CeleryWorker":
        """Start the worker and wait until it consumes its queue."""
        self.record_path.write_text("")
        env = child_env(DQB_SYSTEM=self.system, DQB_URL=self.url, DQB_RECORD=str(self.record_path),
                        DQB_OPTS=json.dumps(self.opts))
        cmd = [sys.executable, "-m", "celery", "-A", "benchmarks.peers.workerapp", "worker", "--pool=solo", "--concurrency", "1",
               "-Q", self.queue, "-l", "WARNING", "--without-gossip", "--without-mingle", "--without-heartbeat",
               "--prefetch-multiplier", str(self.opts["prefetch"]), "-n", f"dqbench-{self.label}@%h"]
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        # Own session: a worker's shutdown must never signal the benchmark's process group.
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        deadline = time.monotonic() + timeout
        conn = connect(self.vhost)
        try:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"worker {self.label} exited with {self.proc.returncode}; see {self.log_path}")
                ch = conn.channel()
                with contextlib.suppress(Exception):
                    if ch.queue_declare(self.queue, passive=True).consumer_count >= 1:
                        ch.close()
                        return self
                if not ch.is_open:
                    conn.close()
                    conn = connect(self.vhost)
                else:
                    ch.close()
                time.sleep(0.2)
        finally:
            conn.close()
        self.stop()
        raise TimeoutError(f"worker {self.label} did not start consuming {self.queue} in {timeout:.0f} s")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def rss_mb(self) -> float:
        return rss_mb(self.pid)

    def records(self) -> list[tuple[int, float, float, int]]:
        """``(seq, due, arrival, hops)`` of every task run so far (warm-ups excluded)."""
        out = []
        for line in self.record_path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 4 and int(parts[0]) >= 0:
                out.append((int(parts[0]), float(parts[1]), float(parts[2]), int(parts[3])))
        return out

    def count(self) -> int:
        """Task runs recorded so far (including warm-ups), without parsing."""
        with open(self.record_path, "rb") as fh:
            return sum(1 for _ in fh)

    def wait_for(self, n: int, timeout: float) -> int:
        """Wait until ``n`` lines are recorded or ``timeout``; returns the count."""
        deadline = time.monotonic() + timeout
        count = self.count()
        while count < n and time.monotonic() < deadline:
            time.sleep(0.1)
            count = self.count()
        return count

    def stop(self, timeout: float = 15.0) -> None:
        """Cold-stop (SIGQUIT) the worker: held ETA messages go back to the queue."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self._log is not None:
            self._log.close()
            self._log = None
        with contextlib.suppress(OSError):
            Path(self.record_path).unlink()


@contextlib.contextmanager
def running_worker(*args: Any, **kwargs: Any) -> Iterator[CeleryWorker]:
    """A started :class:`CeleryWorker`, always stopped afterwards."""
    w = CeleryWorker(*args, **kwargs)
    try:
        yield w.start()
    finally:
        w.stop()
