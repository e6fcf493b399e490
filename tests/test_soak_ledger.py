"""The chaos soak's schedule and ledger (benchmarks/faults/soak_schedule.py, soak_ledger.py): pure, no broker."""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository, for benchmarks.faults
from benchmarks.faults.soak_ledger import Ledger, check, read_dir  # noqa: E402
from benchmarks.faults.soak_procs import MIX, draw_task, ladder_span  # noqa: E402
from benchmarks.faults.soak_schedule import BROKER_FAULTS, CLIENT_FAULTS, draw_schedule  # noqa: E402


def test_a_seed_replays_its_schedule_and_another_seed_draws_another() -> None:
    assert draw_schedule(7, 30) == draw_schedule(7, 30)
    assert draw_schedule(7, 30) != draw_schedule(8, 30)


@pytest.mark.parametrize("minutes", [5, 30])
def test_every_kind_of_fault_is_drawn_inside_the_load(minutes: int) -> None:
    for seed in range(20):
        plans = draw_schedule(seed, minutes)
        kinds = {p.kind for p in plans}
        assert set(CLIENT_FAULTS) <= kinds and "kill9" in kinds, (seed, kinds)
        assert len(kinds & set(BROKER_FAULTS)) >= 2
        assert all(20 <= p.at_s <= minutes * 60 - 45 for p in plans), plans
        assert [p.at_s for p in plans] == sorted(p.at_s for p in plans)
    broker = [p for p in draw_schedule(3, 30) if p.broker]
    assert len(broker) == 12 and all(0 <= p.target < 3 and 5 <= p.down_s <= 30 for p in broker)


def test_some_client_faults_fall_inside_a_broker_fault() -> None:
    overlapping = 0
    for seed in range(20):
        plans = draw_schedule(seed, 30)
        windows = [(p.at_s, p.at_s + p.down_s) for p in plans if p.broker]
        overlapping += sum(1 for p in plans if not p.broker and any(a <= p.at_s <= b for a, b in windows))
    assert overlapping >= 20


def test_bad_length_is_refused() -> None:
    with pytest.raises(ValueError, match="minutes must be positive"):
        draw_schedule(1, 0)


def test_the_mix_keeps_every_due_time_within_the_load_and_laps_past_one_pass() -> None:
    assert ladder_span(7) == pytest.approx(163.83)
    assert abs(sum(share for _, share in MIX) - 1.0) < 1e-9
    rng = random.Random(1)
    drawn = [draw_task(rng, now=0.0, top=600.0, span=ladder_span(8), last_due=1000.0) for _ in range(5000)]
    assert {k for k, _ in drawn} == {k for k, _ in MIX}
    assert all(0.5 <= c <= 1000.0 for _, c in drawn)
    assert all(c > ladder_span(8) for k, c in drawn if k == "lap")
    late = [draw_task(rng, now=990.0, top=600.0, span=ladder_span(8), last_due=1000.0) for _ in range(500)]
    assert all(c <= 10.0 and k not in ("lap", "cancel", "runnow") for k, c in late)


# -- the ledger ---------------------------------------------------------------

def _sent(task_id: str, kind: str = "plain", due: float = 100.0, **more: Any) -> dict[str, Any]:
    return {"ev": "sent", "id": task_id, "kind": kind, "due": due, "t": due - 10, "pub": 0, **more}


def _run(task_id: str, t: float, attempt: int = 0, due: float | None = 100.0, entry: str = "e1",
         worker: str = "w1", pid: str = "11") -> dict[str, Any]:
    return {"id": task_id, "t": t, "attempt": attempt, "due": due, "entry": entry, "worker": worker, "pid": pid,
            "arg_due": due}


def _parked(*ids: str, reason: str = "exhausted", at: float = 104.0) -> list[dict[str, Any]]:
    return [{"task_id": i, "reason": reason, "parked_at": at} for i in ids]


def _check(ledger: Ledger, *, parked: list[dict[str, Any]] | None = None, faults: list[dict[str, Any]] | None = None,
           pending: dict[str, Any] | None = None, leftover: list[str] | None = None) -> dict[str, Any]:
    return check(ledger, parked=parked or [], faults=faults or [], span=164.0,
                 pending_read=pending if pending is not None else {"at": 10_000.0, "pending": {}, "page": []},
                 leftover=leftover or [])


def _fault(n: int, kind: str, start: float, end: float, **more: Any) -> dict[str, Any]:
    return {"n": n, "kind": kind, "broker": kind in BROKER_FAULTS, "target": 0, "start": start, "end": end, **more}


def test_a_clean_run_passes_and_counts_every_kind() -> None:
    ledger = Ledger(
        pubs=[_sent("a"), _sent("b", "flaky", succeed_at=1), _sent("c", "doomed"), _sent("d", "cancel", due=300),
              _sent("e", "runnow", due=300), _sent("f"), {"ev": "ok", "ids": list("abcde"), "t": 91}],
        ops=[{"ev": "cancel", "id": "d", "res": "ok", "t0": 95, "t1": 96},
             {"ev": "runnow", "id": "e", "res": "ok", "t0": 97, "t1": 98}],
        runs=[_run("a", 100.2), _run("b", 100.1), _run("b", 102.5, 1, due=102.4, entry="e2"), _run("c", 100.3),
              _run("c", 101.5, 1, 101.4, "e3"), _run("c", 103.6, 2, 103.5, "e4"), _run("e", 97.5, due=None)])
    out = _check(ledger, parked=_parked("c"))
    assert out["ok"], out["checks"]
    assert out["totals"]["confirmed"] == 5 and out["totals"]["unconfirmed"] == 1
    assert out["totals"]["kinds"] == {"plain": 1, "flaky": 1, "doomed": 1, "cancel": 1, "runnow": 1, "lap": 0}


def test_lost_early_cancelled_and_unparked_tasks_fail_their_checks() -> None:
    ledger = Ledger(
        pubs=[_sent("a"), _sent("b", "flaky", succeed_at=2), _sent("c", "doomed"), _sent("d", "cancel", due=300),
              _sent("e"), {"ev": "ok", "ids": list("abcde"), "t": 91}],
        ops=[{"ev": "cancel", "id": "d", "res": "ok", "t0": 95, "t1": 96}],
        runs=[_run("b", 100.1), _run("b", 102.5, 1, due=102.4, entry="e2"), _run("c", 103.6, 2, 103.5, "e4"),
              _run("d", 300.5, due=300.0), _run("e", 99.99)])
    out = _check(ledger)
    assert out["lost"] == ["a", "b"]  # b never reached its attempt 2
    assert out["early"] == [{"id": "e", "attempt": 0, "by_s": 0.01}]
    assert out["cancelled_run"] == ["d"] and out["parked_missing"] == ["c"]
    assert not any(out["checks"][k] for k in ("lost", "early", "cancelled_run", "parked_listed"))


def test_an_unconfirmed_task_is_never_lost_and_an_open_cancel_may_go_either_way() -> None:
    ledger = Ledger(pubs=[_sent("a"), _sent("b"), _sent("c", "cancel"), {"ev": "failed", "ids": ["a"], "t": 91},
                          {"ev": "error", "ids": ["b"], "t": 91}, {"ev": "ok", "ids": ["c"], "t": 91}],
                    ops=[{"ev": "cancel", "id": "c", "res": "unknown", "t0": 95, "t1": 96}])
    out = _check(ledger)
    assert out["checks"]["lost"] and out["totals"]["publish_failed"] == 1 and out["totals"]["unconfirmed"] == 2


def test_a_run_now_that_ran_twice_fails() -> None:
    ledger = Ledger(pubs=[_sent("e", "runnow", due=300), {"ev": "ok", "ids": ["e"], "t": 91}],
                    ops=[{"ev": "runnow", "id": "e", "res": "ok", "t0": 97, "t1": 98}],
                    runs=[_run("e", 97.5, due=None), _run("e", 300.1, due=300.0)])
    assert _check(ledger)["runnow_bad"] == ["e"]


def test_duplicates_are_attributed_to_the_fault_that_explains_them_or_fail() -> None:
    faults = [_fault(1, "worker_kill9", 100.5, 110, worker="w1"), _fault(2, "kill9", 200, 230)]
    ledger = Ledger(pubs=[_sent("a"), _sent("b", due=220), _sent("c", due=500),
                          {"ev": "ok", "ids": ["a", "b", "c"], "t": 91}],
                    runs=[_run("a", 100.2), _run("a", 112, worker="w2"),
                          _run("b", 240, due=220), _run("b", 241, due=220, worker="w2"),
                          _run("c", 500.1, due=500), _run("c", 500.2, due=500)])
    out = _check(ledger, faults=faults)
    whys = [d["why"] for d in out["duplicates"]]
    assert whys[0].startswith("#1 worker_kill9 of w1") and whys[1].startswith("#2 kill9 of node 1")
    assert whys[2] == "unexplained" and not out["checks"]["duplicates_explained"]
    assert out["fault_effect"][0]["duplicates"] == 1 and out["fault_effect"][1]["tasks_due"] == 1


def test_pending_must_list_exactly_the_waiting_confirmed_tasks() -> None:
    ledger = Ledger(pubs=[_sent("a", due=500), _sent("b", due=500), _sent("c", "cancel", due=500),
                          {"ev": "ok", "ids": ["a", "b", "c"], "t": 91}],
                    ops=[{"ev": "cancel", "id": "c", "res": "ok", "t0": 95, "t1": 96}],
                    runs=[_run("a", 500.1, due=500), _run("b", 500.1, due=500)])
    good = {"at": 100.0, "pending": {"a": 500.0, "b": 500.0}, "page": ["a", "b"]}
    assert _check(ledger, pending=good)["checks"]["pending_agrees"]
    out = _check(ledger, pending={"at": 100.0, "pending": {"a": 500.0, "c": 500.0, "zz": 400.0}, "page": ["a"]})
    p = out["pending"]
    assert p["missing"] == ["b"] and p["cancelled_listed"] == ["c"] and p["unknown"] == ["zz"]
    assert p["page_differs"] == 2 and not out["checks"]["pending_agrees"]
    assert not check(ledger, parked=[], faults=[], span=164.0, pending_read=None, leftover=[])["checks"]["pending_agrees"]


def test_a_queue_left_behind_fails() -> None:
    assert not _check(Ledger(), leftover=["soak1.L0x1"])["checks"]["no_queue_left"]


def test_read_dir_skips_a_line_cut_by_a_kill(tmp_path: Path) -> None:
    (tmp_path / "pub-0-1.jsonl").write_text('{"ev": "sent", "id": "a", "kind": "plain", "due": 1}\n{"ev": "ok", "id')
    (tmp_path / "run-w1-42.jsonl").write_text('{"id": "a", "t": 2, "attempt": 0}\n')
    ledger = read_dir(tmp_path)
    assert len(ledger.pubs) == 1 and ledger.runs[0]["pid"] == "42"


def test_a_retry_parked_after_its_publish_failed_is_explained_only_by_a_broker_fault() -> None:
    ledger = Ledger(pubs=[_sent("b", "flaky", succeed_at=1), {"ev": "ok", "ids": ["b"], "t": 91}],
                    runs=[_run("b", 100.1), _run("b", 140.0, 1, due=139.0, entry="e2")])
    during = _check(ledger, parked=_parked("b", reason="retry-failed", at=131.0),
                    faults=[_fault(1, "partition", 95.0, 125.0)])
    assert during["checks"]["parked_listed"] and during["totals"]["parked_retry_failed"] == 1
    assert during["parked_retry_failed"][0]["why"].startswith("#1 partition")
    alone = _check(ledger, parked=_parked("b", reason="retry-failed", at=131.0))
    assert alone["parked_unexpected"] == ["b"] and not alone["checks"]["parked_listed"]
    exhausted = _check(ledger, parked=_parked("b", at=131.0), faults=[_fault(1, "partition", 95.0, 125.0)])
    assert exhausted["parked_unexpected"] == ["b"]


def test_a_task_whose_cancel_ended_in_an_error_may_be_listed_by_pending_or_not() -> None:
    ledger = Ledger(pubs=[_sent("c", "cancel", due=500), {"ev": "ok", "ids": ["c"], "t": 91}],
                    ops=[{"ev": "cancel", "id": "c", "res": "unknown", "t0": 95, "t1": 96}],
                    runs=[_run("c", 500.1, due=500)])
    for listed in ({"c": 500.0}, {}):
        assert _check(ledger, pending={"at": 100.0, "pending": listed, "page": list(listed)})["checks"]["pending_agrees"]


def test_a_retry_parked_because_its_publish_timed_out_is_accounted_for_not_lost() -> None:
    ledger = Ledger(pubs=[_sent("c", "doomed"), {"ev": "ok", "ids": ["c"], "t": 91}],
                    runs=[_run("c", 100.3), _run("c", 101.5, 1, 101.4, "e3")])
    fault = [_fault(1, "partition", 95.0, 125.0)]
    assert _check(ledger, faults=fault)["lost"] == ["c"]
    out = _check(ledger, parked=_parked("c", reason="retry-failed", at=110.0), faults=fault)
    assert out["checks"]["lost"] and out["checks"]["parked_listed"] and out["totals"]["parked_retry_failed"] == 1
