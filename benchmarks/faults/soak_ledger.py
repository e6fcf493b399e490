"""The chaos soak's ledger: what was promised, what happened, and the checks (pure, but for :func:`read_dir`).

Promised: every task a publisher was told was accepted (``ok``: confirmed), with its kind and due time;
a task named by ``PublishError.failed`` or lost in an ``error`` was not promised (if it runs anyway it is
counted, never as lost). Done: every run the tasks recorded themselves (id, attempt, worker, time, the
pass's due time and entry), the operator's cancels and run-nows, the parking queue read at the end.

The checks (none is loosened for a fault):

- lost: a confirmed task whose last expected run never came (a retry's last attempt; a parked task's
  last attempt), unless a cancel of it was confirmed;
- early: a run before its pass's due time (``x-delayq-due``), or a first run before the due time its
  publisher computed (which is earlier than the real one) unless it was run now;
- cancelled and run: any run of a task whose cancel was confirmed;
- run-now: a task moved by a confirmed run-now runs exactly once, after the run-now started;
- parked: every task that exhausted its retries is in the parking queue; anything else there must be a
  retry whose publish failed or was not confirmed (the worker parks the attempt rather than lose it,
  reason ``retry-failed``) during a broker fault: a copy that may run again if replayed, counted
  apart like a duplicate;
- duplicates: a second run of one (task, attempt), each attributed to a fault (:func:`attribute`);
  one that no fault explains fails the run;
- pending: once the cluster is healthy, ``pending`` and the page list exactly the confirmed tasks
  still waiting (due later than the read plus a margin), no cancelled one;
- leftover: no queue left after ``delayq topology delete``.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

__all__ = ["Ledger", "read_dir", "check", "attribute", "percentiles", "PENDING_MARGIN_S"]

#: Tasks due within this many seconds of the pending read are left out of its comparison (they may run
#: between the ledger's read and the index's).
PENDING_MARGIN_S = 15.0

_RETRY_LAST = {"doomed": 2}  # max_retries of soak.doomed: its attempt 2 parks


@dataclass
class Ledger:
    """Every row the soak's processes wrote, by kind of writer."""

    pubs: list[dict[str, Any]] = field(default_factory=list)
    ops: list[dict[str, Any]] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)

    @property
    def sent(self) -> dict[str, dict[str, Any]]:
        return {r["id"]: r for r in self.pubs if r["ev"] == "sent"}

    @property
    def confirmed(self) -> set[str]:
        return {i for r in self.pubs if r["ev"] == "ok" for i in r["ids"]}

    @property
    def failed(self) -> set[str]:
        return {i for r in self.pubs if r["ev"] == "failed" for i in r["ids"]}

    def operations(self, kind: str) -> dict[str, dict[str, Any]]:
        """The operator's final result per task for ``cancel`` or ``runnow``."""
        return {r["id"]: r for r in self.ops if r["ev"] == kind}


def read_dir(path: Path) -> Ledger:
    """The ledger files of a run (a line cut by a kill -9 is left out)."""
    ledger = Ledger()
    for file in sorted(path.glob("*.jsonl")):
        rows = []
        for line in file.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
        if file.name.startswith("pub-"):
            ledger.pubs += rows
        elif file.name.startswith("op-"):
            ledger.ops += rows
        elif file.name.startswith("run-"):
            pid = file.stem.rsplit("-", 1)[-1]
            ledger.runs += [{**r, "pid": pid} for r in rows]
    return ledger


def percentiles(values: Iterable[float]) -> dict[str, float | int]:
    """n, p50, p90, p99 and max of ``values`` (rounded to 0.01; empty: n = 0 only)."""
    xs = sorted(values)
    if not xs:
        return {"n": 0}
    q = statistics.quantiles(xs, n=100) if len(xs) > 1 else [xs[0]] * 99
    return {"n": len(xs), "p50": round(q[49], 2), "p90": round(q[89], 2), "p99": round(q[98], 2),
            "max": round(xs[-1], 2)}


def _expected_last_attempt(sent: dict[str, Any]) -> int:
    if sent["kind"] == "flaky":
        return int(sent.get("succeed_at") or 0)
    return _RETRY_LAST.get(sent["kind"], 0)


def attribute(dup: dict[str, Any], before: dict[str, Any], faults: list[dict[str, Any]],
              dup_attempts: set[tuple[str, int]], span: float) -> str:
    """Which fault explains the run ``dup``, a second run of the (task, attempt) ``before`` ran first.

    In order: the first run's worker was killed or restarted (or its connection cut) between the two
    runs (the message was acked after the task ran: ``task_acks_late``); the previous attempt ran twice
    (two retries published); a broker fault while the message was in the ladder or the destination
    (at-least-once dead-lettering and redelivery). Otherwise ``unexplained``.
    """
    t0, t1 = float(before["t"]), float(dup["t"])
    for f in faults:
        if f["kind"] in ("worker_kill9", "worker_restart") and f.get("worker") == before["worker"] \
                and t0 - 1.0 <= f["start"] <= t1:
            return f"#{f['n']} {f['kind']} of {before['worker']}: its unacked message redelivered"
        if f["kind"] == "conn_cut" and f.get("pid") and str(f["pid"]) == str(before["pid"]) \
                and t0 - 1.0 <= f["start"] <= t1:
            return f"#{f['n']} conn_cut of {before['worker']}'s connection: its unacked message redelivered"
    attempt = int(dup["attempt"])
    if attempt > 0 and (dup["id"], attempt - 1) in dup_attempts and dup.get("entry") != before.get("entry"):
        return f"attempt {attempt - 1} ran twice, so it was retried twice"
    due = float(dup.get("due") or before.get("due") or t0)
    for f in faults:
        if f["broker"] and f["start"] <= t1 and f["end"] + 60.0 >= due - span:
            return f"#{f['n']} {f['kind']} of node {f['target'] + 1}: at-least-once dead-lettering/redelivery"
    return "unexplained"


def check(ledger: Ledger, *, parked: list[dict[str, Any]], faults: list[dict[str, Any]], span: float,
          pending_read: dict[str, Any] | None, leftover: list[str]) -> dict[str, Any]:
    """The run's totals and checks; ``ok`` is true only when every check holds.

    ``parked``: the parking queue's messages (``task_id``, ``reason``, ``parked_at``). ``faults``: what ran (``n``, ``kind``, ``broker``, ``target``, ``start``, ``end``, and ``worker``/``pid``
    for client faults). ``pending_read``: ``{"at": t, "pending": {id: due}, "page": [ids]}`` read once
    healthy, or ``None`` when it could not be read (a failed check).
    """
    sent, confirmed, failed = ledger.sent, ledger.confirmed, ledger.failed
    cancels, runnows = ledger.operations("cancel"), ledger.operations("runnow")
    runs_by: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in sorted(ledger.runs, key=lambda r: float(r["t"])):
        runs_by[(r["id"], int(r["attempt"]))].append(r)
    ran_ids = {k[0] for k in runs_by}
    cancelled_ok = {i for i, r in cancels.items() if r["res"] == "ok"}
    runnow_ok = {i: r for i, r in runnows.items() if r["res"] == "ok"}
    open_ops = {i for i, r in {**cancels, **runnows}.items() if r["res"] == "unknown"}

    retry_failed = {str(p["task_id"]) for p in parked if p.get("reason") == "retry-failed"}

    def parked_retry(task_id: str) -> bool:
        return task_id in retry_failed

    lost, early, cancelled_run, runnow_bad = [], [], [], []
    for task_id in sorted(confirmed):
        s = sent.get(task_id)
        if s is None:
            continue  # its "sent" line was cut by a kill -9: cannot be, a line is written before the publish
        last = _expected_last_attempt(s)
        if task_id in cancelled_ok:
            if task_id in ran_ids:
                cancelled_run.append(task_id)
            continue
        if task_id in open_ops:
            if s["kind"] == "runnow" and task_id not in ran_ids:
                lost.append(task_id)  # whatever the run-now did, the task runs (moved or where it was)
            continue
        if (task_id, last) not in runs_by and not parked_retry(task_id):
            lost.append(task_id)  # (a retry parked because its publish failed waits in the parking queue)
        if task_id in runnow_ok:
            got = runs_by.get((task_id, 0), [])
            if len(got) != 1 or float(got[0]["t"]) < float(runnow_ok[task_id]["t0"]):
                runnow_bad.append(task_id)
    moved = set(runnow_ok) | open_ops
    for (task_id, attempt), rs in runs_by.items():
        s = sent.get(task_id)
        for r in rs:
            due = r.get("due")
            if due is not None and float(r["t"]) < float(due):
                early.append({"id": task_id, "attempt": attempt, "by_s": round(float(due) - float(r["t"]), 4)})
            elif due is None and attempt == 0 and task_id not in moved and s is not None \
                    and float(r["t"]) < float(s["due"]):
                early.append({"id": task_id, "attempt": 0, "by_s": round(float(s["due"]) - float(r["t"]), 4),
                              "note": "no ladder headers"})

    dup_keys = {k for k, rs in runs_by.items() if len(rs) > 1}
    duplicates = []
    for (task_id, attempt), rs in sorted(runs_by.items(), key=lambda kv: float(kv[1][0]["t"])):
        for before, dup in zip(rs, rs[1:]):
            why = attribute(dup, before, faults, dup_keys, span)
            duplicates.append({"id": task_id, "attempt": attempt, "first_t": before["t"], "t": dup["t"],
                               "same_pass": dup.get("entry") == before.get("entry"), "why": why})
    by_cause: dict[str, int] = defaultdict(int)
    for d in duplicates:
        by_cause[d["why"].split(":")[0]] += 1

    must_park = {i for i in confirmed if sent.get(i, {}).get("kind") == "doomed"} - cancelled_ok
    parked_set = {str(p["task_id"]) for p in parked}
    parked_missing = sorted(i for i in must_park if (i, 2) in runs_by and i not in parked_set)
    parked_missing += sorted(i for i in must_park if (i, 2) not in runs_by and i not in parked_set and i not in lost)
    doomed = {i for i, s in sent.items() if s["kind"] == "doomed"}
    parked_retry_failed, parked_unexpected = [], []
    for p in parked:
        if p["task_id"] in doomed and p.get("reason") != "retry-failed":
            continue
        at = float(p.get("parked_at") or 0)
        near = [f for f in faults if f["broker"] and f["start"] - 60.0 <= at <= f["end"] + 60.0]
        if p.get("reason") == "retry-failed" and near:
            parked_retry_failed.append({"id": p["task_id"], "why": f"#{near[0]['n']} {near[0]['kind']}: its retry's "
                                        "publish failed or was not confirmed; parked rather than lost"})
        else:
            parked_unexpected.append(str(p["task_id"]))

    pending_check: dict[str, Any] = {"read": pending_read is not None}
    if pending_read is not None:
        at = float(pending_read["at"])
        listed = {i for i, due in pending_read["pending"].items() if float(due) > at + PENDING_MARGIN_S}
        page = set(pending_read["page"])
        ran_before = {k[0] for k, rs in runs_by.items() if float(rs[0]["t"]) <= at}
        expected = {i for i in confirmed if i in sent and sent[i]["kind"] in ("plain", "lap", "cancel", "runnow")
                    and float(sent[i]["due"]) > at + PENDING_MARGIN_S + 2.0
                    and i not in cancelled_ok and i not in moved and i not in ran_before}
        known = set(sent)
        pending_check.update(
            at=at, listed=len(listed), expected=len(expected),
            missing=sorted(expected - listed)[:20], n_missing=len(expected - listed),
            unknown=sorted(listed - known)[:20], cancelled_listed=sorted(listed & cancelled_ok)[:20],
            page_differs=len(page ^ set(pending_read["pending"])))
        # a task listed that the ledger says will not wait there (ran, or moved) is a disagreement too;
        # one whose cancel or run-now ended in an error may be listed or not
        extra = {i for i in listed - expected - open_ops
                 if i in known and sent[i]["kind"] in ("plain", "lap", "cancel", "runnow")
                 and float(sent[i]["due"]) > at + PENDING_MARGIN_S + 2.0}
        pending_check.update(n_extra=len(extra), extra=sorted(extra)[:20])

    late: list[float] = []
    per_task: list[dict[str, Any]] = []
    for (task_id, attempt), rs in runs_by.items():
        due = rs[0].get("due")
        if due is None:
            continue
        lateness = float(rs[0]["t"]) - float(due)
        hit = [f["n"] for f in faults if f["start"] <= float(due) <= f["end"] + 30.0]
        late.append(lateness)
        per_task.append({"late": lateness, "faults": hit, "broker": any(faults[n - 1]["broker"] for n in hit)})
    fault_effect = []
    for f in faults:
        mine = [p["late"] for p in per_task if f["n"] in p["faults"]]
        fault_effect.append({"n": f["n"], "tasks_due": len(mine), "late": percentiles(mine),
                             "duplicates": sum(1 for d in duplicates if d["why"].startswith(f"#{f['n']} "))})

    unexplained = [d for d in duplicates if d["why"] == "unexplained"]
    pending_ok = pending_read is not None and not (pending_check.get("n_missing") or pending_check.get("unknown")
                                                   or pending_check.get("cancelled_listed")
                                                   or pending_check.get("page_differs")
                                                   or pending_check.get("n_extra"))
    checks = {"lost": len(lost) == 0, "early": len(early) == 0, "cancelled_run": len(cancelled_run) == 0,
              "runnow_once": len(runnow_bad) == 0, "parked_listed": not parked_missing and not parked_unexpected,
              "duplicates_explained": not unexplained, "pending_agrees": pending_ok, "no_queue_left": not leftover}
    unconfirmed = set(sent) - confirmed
    return {
        "ok": all(checks.values()), "checks": checks,
        "totals": {
            "sent": len(sent), "confirmed": len(confirmed), "publish_failed": len(failed),
            "unconfirmed": len(unconfirmed), "unconfirmed_ran": len(unconfirmed & ran_ids),
            "kinds": {k: sum(1 for i in confirmed if sent.get(i, {}).get("kind") == k)
                      for k in ("plain", "flaky", "doomed", "cancel", "runnow", "lap")},
            "runs": len(ledger.runs), "cancels_ok": len(cancelled_ok),
            "cancels_notfound": sum(1 for r in cancels.values() if r["res"] == "notfound"),
            "runnows_ok": len(runnow_ok), "ops_unknown": len(open_ops),
            "ops_skipped": sum(1 for r in {**cancels, **runnows}.values() if r["res"] == "skipped"),
            "parked": len(parked), "parked_retry_failed": len(parked_retry_failed), "laps_seen": sum(1 for r in ledger.runs if r.get("laps")),
            "duplicates": len(duplicates),
        },
        "lost": lost[:50], "n_lost": len(lost), "early": early[:50], "n_early": len(early),
        "cancelled_run": cancelled_run, "runnow_bad": runnow_bad, "parked_missing": parked_missing,
        "parked_unexpected": parked_unexpected, "parked_retry_failed": parked_retry_failed,
        "duplicates_by_cause": dict(by_cause),
        "duplicates": duplicates[:200], "pending": pending_check, "leftover": leftover,
        "lateness": {"all": percentiles(late), "no_fault": percentiles(p["late"] for p in per_task if not p["faults"]),
                     "broker_fault": percentiles(p["late"] for p in per_task if p["broker"]),
                     "client_fault_only": percentiles(p["late"] for p in per_task if p["faults"] and not p["broker"])},
        "fault_effect": fault_effect,
    }
