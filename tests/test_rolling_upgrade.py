"""A rolling upgrade from 0.1.0 to this release, both ways round, on a real broker and real workers.

0.1.0 is the wheel that release shipped (``tests/data/celery_delayq-0.1.0-py3-none-any.whl``, built
from 287afbb), unpacked and put first on ``PYTHONPATH`` of the processes that play the old release;
the others run this checkout. Each process is a real ``celery worker`` or a publisher script of its own.

* **workers first**: 0.1.0 publishes and works; the worker is replaced by this release while tasks
  (and a retry) wait; 0.1.0 goes on publishing to it.
* **publishers first**: 0.1.0 publishes and works; the publisher is replaced by this release while
  tasks wait; the 0.1.0 worker runs what it publishes.

In both, this release's ``delayq pending`` lists what either release wrote and still waits, its
``delayq cancel`` cancels a task 0.1.0 published and one it published itself, and the worker of
either release honours both cancels. At the end every task ran exactly once, none before its due
time, and neither cancelled task ran.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
import zipfile
from pathlib import Path
from typing import Any, Iterator

import pytest

from helpers import management_url

WHEEL = Path(__file__).parent / "data" / "celery_delayq-0.1.0-py3-none-any.whl"
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def release_0_1_0(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """0.1.0's package, unpacked from its wheel (pure Python: unpacking is installing)."""
    where = tmp_path_factory.mktemp("celery_delayq-0.1.0")
    with zipfile.ZipFile(WHEEL) as wheel:
        wheel.extractall(where)
    return where


APP = '''
import json, os, time
from celery import Celery
import celery_delayq
from celery_delayq import DelayedRetryTask

app = Celery("proj", broker={broker!r}, set_as_current=True)
app.conf.update(
    delayq_enabled=True, delayq_prefix={prefix!r}, delayq_management_url={management!r},
    task_default_queue={queue!r}, broker_heartbeat=0, worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True, worker_prefetch_multiplier=20,
)
LEDGER = {ledger!r}


def note(**row):
    row.update(at=time.time(), release=celery_delayq.__version__, pid=os.getpid(),
               code=os.path.dirname(celery_delayq.__file__))
    with open(LEDGER, "a") as out:
        out.write(json.dumps(row) + "\\n")


@app.task(name="proj.job")
def job(tag):
    note(tag=tag)


@app.task(name="proj.flaky", base=DelayedRetryTask, bind=True)
def flaky(self, tag):
    note(tag=tag, attempt=self.request.retries)
    if self.request.retries == 0:
        raise self.retry(countdown=6)


from celery.signals import worker_ready

@worker_ready.connect
def ready(**_):
    open(LEDGER + ".ready." + str(os.getpid()), "w").close()
'''

PUBLISH = '''
import json, os, sys, time
from proj import job, flaky
import celery_delayq

out = open(sys.argv[1], "a")
for tag, countdown, kind in json.loads(sys.argv[2]):
    due = time.time() + countdown
    result = (flaky if kind == "flaky" else job).apply_async((tag,), countdown=countdown)
    out.write(json.dumps({{"tag": tag, "id": result.id, "due": due, "kind": kind,
                          "code": celery_delayq.__file__}}) + "\\n")
out.close()
'''


class Project:
    """A project directory with ``proj.py``, run by either release."""

    def __init__(self, root: Path, old: Path, broker_url: str, uid: str) -> None:
        self.root, self.old = root, old
        self.ledger = root / "ran.jsonl"
        self.published = root / "published.jsonl"
        self.prefix = f"dqup{uid}"
        (root / "proj.py").write_text(APP.format(broker=broker_url, prefix=self.prefix, queue=f"up.{uid}",
                                                 management=management_url(), ledger=str(self.ledger)))
        (root / "publish.py").write_text(PUBLISH.format())
        self.workers: list[subprocess.Popen[bytes]] = []

    def env(self, release: str) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(self.old), str(self.root)] if release == "0.1.0"
                                            else [str(REPO), str(self.root)])
        env.pop("DELAYQ_DEBUG", None)
        return env

    def celery(self, release: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([sys.executable, "-m", "celery", "-A", "proj", *args], cwd=self.root,
                              env=self.env(release), capture_output=True, text=True, timeout=120)
        if check and done.returncode != 0:
            raise AssertionError(f"celery {' '.join(args)} ({release}) exited {done.returncode}:\n"
                                 f"{done.stdout}\n{done.stderr}")
        return done

    def publish(self, release: str, tasks: list[tuple[str, float, str]]) -> None:
        done = subprocess.run([sys.executable, "publish.py", str(self.published), json.dumps(tasks)],
                              cwd=self.root, env=self.env(release), capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr

    def start_worker(self, release: str) -> subprocess.Popen[bytes]:
        before = set(self.root.glob("ran.jsonl.ready.*"))
        log = open(self.root / f"worker-{release}-{len(self.workers)}.log", "wb")
        worker = subprocess.Popen([sys.executable, "-m", "celery", "-A", "proj", "worker", "-P", "solo",
                                   "--loglevel", "INFO", "-n", f"{release}-{uuid.uuid4().hex[:6]}@%h"],
                                  cwd=self.root, env=self.env(release), stdout=log, stderr=subprocess.STDOUT)
        self.workers.append(worker)
        deadline = time.time() + 60
        while set(self.root.glob("ran.jsonl.ready.*")) == before:
            assert worker.poll() is None, (self.root / log.name).read_text()
            assert time.time() < deadline, "the worker did not get ready in 60 s"
            time.sleep(0.2)
        return worker

    def stop_worker(self, worker: subprocess.Popen[bytes]) -> None:
        worker.send_signal(signal.SIGTERM)  # warm shutdown: what a deploy does
        worker.wait(timeout=60)

    def rows(self, path: Path) -> list[dict[str, Any]]:
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def pending(self) -> dict[str, Any]:
        return {t["task_id"]: t for t in json.loads(self.celery("new", "delayq", "pending", "--json").stdout)}

    def close(self) -> None:
        for worker in self.workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        self.celery("new", "delayq", "topology", "delete", "--discard-messages", "--parking", "--yes", check=False)


@pytest.fixture
def project(tmp_path: Path, release_0_1_0: Path, broker_url: str, uid: str) -> Iterator[Project]:
    proj = Project(tmp_path, release_0_1_0, broker_url, uid)
    yield proj
    proj.close()
    listing = subprocess.run(["rabbitmqctl", "list_queues", "-q", "-p", broker_url.rsplit("/", 1)[1]
                              .replace("%2F", "/") or "/", "name"], capture_output=True, text=True, timeout=60)
    left = [q for q in listing.stdout.split() if q.startswith(proj.prefix)]
    assert not left, f"topology delete left {left}"


@pytest.mark.timeout(420)
@pytest.mark.parametrize("first", ["workers", "publishers"])
def test_a_rolling_upgrade_from_0_1_0_loses_nothing_runs_nothing_early_or_twice(project: Project, first: str) -> None:
    old_worker = project.start_worker("0.1.0")
    # Both on 0.1.0: tasks due before, across and after the switch, a retry, and one to cancel later.
    project.publish("0.1.0", [(f"a{i}", 1.0 + 1.5 * i, "job") for i in range(10)]
                    + [("retry-a", 2.0, "flaky"), ("doomed-old", 24.0, "job"), ("late-a", 20.0, "job")])
    time.sleep(3.0)
    if first == "workers":
        project.stop_worker(old_worker)  # tasks and the retry wait in the ladder across the switch
        project.start_worker("new")
        second_publisher = "0.1.0"
    else:
        second_publisher = "new"
    project.publish(second_publisher, [(f"b{i}", 1.0 + 1.0 * i, "job") for i in range(6)]
                    + [("retry-b", 1.0, "flaky"), ("doomed-new", 22.0, "job"), ("late-b", 16.0, "job")])
    published = {r["tag"]: r for r in project.rows(project.published)}
    old_code = str(project.old)
    phase_one = {f"a{i}" for i in range(10)} | {"retry-a", "doomed-old", "late-a"}
    for tag, row in published.items():  # who published what: 0.1.0 first, then the second publisher
        assert row["code"].startswith(old_code) == (tag in phase_one or second_publisher == "0.1.0"), (tag, row)
    # This release lists what either release wrote and still waits, and cancels one task of each.
    listed = project.pending()
    for tag in ("doomed-old", "late-a", "doomed-new", "late-b"):
        assert published[tag]["id"] in listed, (tag, sorted(listed))
    assert listed[published["doomed-old"]["id"]]["task"] == "proj.job"
    cancelled = project.celery("new", "delayq", "cancel", published["doomed-old"]["id"],
                               published["doomed-new"]["id"], "--json")
    assert [c["task_id"] for c in json.loads(cancelled.stdout)] == [published["doomed-old"]["id"],
                                                                     published["doomed-new"]["id"]]
    waiting = project.pending()
    assert published["doomed-old"]["id"] not in waiting and published["late-a"]["id"] in waiting

    last_due = max(r["due"] for r in published.values()) + 6.0  # the retries wait 6 s more
    expected = {tag for tag in published if not tag.startswith("doomed")}
    deadline = last_due + 30
    while time.time() < deadline:
        ran = {r["tag"] for r in project.rows(project.ledger)}
        if expected <= ran and time.time() > last_due + 2:
            break
        time.sleep(0.5)
    ran_rows = project.rows(project.ledger)
    by_tag: dict[str, list[dict[str, Any]]] = {}
    for row in ran_rows:
        by_tag.setdefault(row["tag"], []).append(row)
    assert not (expected - set(by_tag)), f"lost: {sorted(expected - set(by_tag))}"
    assert not {"doomed-old", "doomed-new"} & set(by_tag), "a cancelled task ran"
    for tag in expected:
        runs = by_tag[tag]
        if published[tag]["kind"] == "flaky":
            assert sorted(r["attempt"] for r in runs) == [0, 1], (tag, runs)  # the retry ran once, too
            first_run, retry = sorted(runs, key=lambda r: r["attempt"])
            assert retry["at"] >= first_run["at"] + 6.0, (tag, runs)
        else:
            assert len(runs) == 1, f"{tag} ran {len(runs)} times: {runs}"
        assert min(r["at"] for r in runs) >= published[tag]["due"], f"{tag} ran early: {runs}"
    # Who ran what: the switch really happened while tasks waited.
    releases = {r["code"].startswith(str(project.old)) for r in ran_rows}
    if first == "workers":
        assert releases == {True, False}  # some before the switch (0.1.0), the rest after (this release)
        assert all(not r["code"].startswith(str(project.old)) for r in by_tag["late-a"] + by_tag["retry-a"]
                   if r.get("attempt", 1) == 1 or r["tag"] == "late-a")
    else:
        assert releases == {True}  # the 0.1.0 worker ran everything, this release's publishes included
