"""Retry storms (pure Python over retries_per_minute rows)."""

from __future__ import annotations

from celery_delayq.analytics.storms import find_storms

T0 = 1_704_067_200


def rows(task: str, per_minute: list[int], start: int = T0) -> list[dict]:
    return [{"task_name": task, "minute_s": start + 60 * i, "retries": n}
            for i, n in enumerate(per_minute) if n]


def test_a_jump_over_the_tasks_own_normal_is_a_storm():
    steady = [5, 6, 4, 5, 5, 6, 5, 4, 5, 5] * 2
    storm = [40, 80, 75, 0, 60]  # one calm minute inside: still one storm
    after = [5, 5, 4, 6, 5, 5]
    found = find_storms(rows("crm.sync", steady + storm + after))
    assert len(found) == 1
    s = found[0]
    assert (s.task_name, s.start_s, s.end_s) == ("crm.sync", T0 + 1200, T0 + 1500)
    assert (s.peak_per_minute, s.baseline_per_minute, s.retries) == (80, 5.0, 255)


def test_a_busy_but_steady_task_is_no_storm():
    assert find_storms(rows("busy", [300, 310, 290, 305, 320, 300, 310] * 5)) == []


def test_a_small_jump_is_no_storm():
    # 0 -> 9 per minute is below the absolute floor of 10.
    assert find_storms(rows("quiet", [0, 0, 1, 0, 9, 8, 0])) == []


def test_a_long_storm_does_not_become_the_new_normal():
    found = find_storms(rows("t", [2] * 20 + [50] * 40 + [2] * 5))
    assert len(found) == 1 and found[0].end_s - found[0].start_s == 40 * 60


def test_storms_of_several_tasks_are_sorted_by_start():
    data = rows("b", [1] * 20 + [30, 30]) + rows("a", [1] * 16 + [25] + [1] * 6)
    assert [(s.task_name, (s.start_s - T0) // 60) for s in find_storms(data)] == [("a", 16), ("b", 20)]


def test_a_start_up_ramp_is_no_storm():
    """Retries climb from zero as the first delays elapse: learning, not storming."""
    ramp = [0, 0, 0, 0, 0, 0, 3, 11, 21, 28, 28, 29, 28, 28, 28] + [28, 30, 29, 31] * 10
    assert find_storms(rows("reports", ramp)) == []


def test_a_task_quiet_before_its_storm_is_caught_at_once():
    data = rows("busy", [5] * 20) + rows("new", [0] * 18 + [30, 40], start=T0)
    assert [(s.task_name, (s.start_s - T0) // 60) for s in find_storms(data)] == [("new", 18)]
