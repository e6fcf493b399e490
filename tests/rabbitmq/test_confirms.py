"""confirms.py: trackers, naming and settling (pure), and a confirm channel on the real broker."""

from __future__ import annotations

import amqp
import pytest

from celery_delayq.ladder import headers as H
from celery_delayq.rabbitmq.confirms import ConfirmChannel, Pending, Tracker, fail, message_name
from celery_delayq.errors import PublishError, PublishNacked, PublishReturned, PublishTimeout
from celery_delayq.rabbitmq.confirms import combine


def _msg(entry: str, **props: object) -> amqp.Message:
    headers = {H.ENTRY: entry, **props.pop("headers", {})}  # type: ignore[dict-item]
    return amqp.Message(b"x", application_headers=headers, **props)


# -- pure ---------------------------------------------------------------------------------
def test_a_message_is_named_by_task_id_then_message_id_then_entry() -> None:
    assert message_name(_msg("e1", headers={"id": "task-1"}, message_id="m1"), "e1") == "task-1"
    assert message_name(_msg("e1", message_id="m1"), "e1") == "m1"
    assert message_name(_msg("e1"), "e1") == "e1"


def test_fail_settles_each_tracker_with_only_its_own_messages() -> None:
    a, b = Tracker(outstanding=2), Tracker(outstanding=1)
    items = [Pending("e1", _msg("e1"), "x", "k", a, "t1"), Pending("e2", _msg("e2"), "x", "k", b, "t2"),
             Pending("e3", _msg("e3"), "x", "k", a, "t3")]
    fail(items, lambda mine: PublishError("lost", failed=[p.name for p in mine], entries=[p.entry for p in mine]))
    assert (a.outstanding, b.outstanding) == (0, 0)
    assert [f.failed for f in a.take_failures()] == [["t1", "t3"]]
    assert [f.entries for f in b.take_failures()] == [["e2"]]
    assert a.take_failures() == []  # taken once, never again


def test_combine_names_everything_once_and_keeps_a_common_type() -> None:
    one = PublishNacked("n", failed=["t1"], entries=["e1"])
    assert combine([one]) is one
    both = combine([one, PublishNacked("n2", failed=["t2"], entries=["e2"])], also=[("t3", "e3")])
    assert type(both) is PublishNacked and both.failed == ["t1", "t2", "t3"] and both.entries == ["e1", "e2", "e3"]
    mixed = combine([one, PublishReturned("r", failed=["t4"], entries=["e4"])])
    assert type(mixed) is PublishError and mixed.failed == ["t1", "t4"]
    cause = PublishTimeout("slow")
    assert combine([], cause=cause) is cause  # nothing to name: the cause as it is


def test_publish_error_entries_default_to_failed() -> None:
    err = PublishError("x", failed=["a"])
    assert err.entries == ["a"]


# -- on the broker ----------------------------------------------------------------------------
@pytest.fixture
def confirm(amqp_conn: amqp.Connection) -> ConfirmChannel:
    return ConfirmChannel(amqp_conn)


@pytest.fixture
def queue(amqp_conn: amqp.Connection, uid: str):
    name = f"confirms.{uid}"
    amqp_conn.channel().queue_declare(name, durable=True, auto_delete=False)
    yield name
    amqp_conn.channel().queue_delete(name)


def test_outcomes_land_in_the_tracker_of_their_publish(confirm: ConfirmChannel, queue: str, uid: str) -> None:
    ok, bad = Tracker(), Tracker()
    confirm.publish(_msg("e-ok", headers={"id": "t-ok"}), "", queue, ok)
    confirm.publish(_msg("e-bad", headers={"id": "t-bad"}), "", f"no-such-queue.{uid}", bad)
    assert bad.outstanding == 1  # the last publish: its confirm cannot have been read yet
    confirm.wait(timeout=10, tracker=bad)
    confirm.wait(timeout=10, tracker=ok)
    assert ok.failures == [] and ok.outstanding == 0
    (returned,) = bad.take_failures()
    assert isinstance(returned, PublishReturned) and returned.failed == ["t-bad"] and returned.entries == ["e-bad"]
    assert confirm.failures == []  # nothing in the channel's own tracker


def test_take_and_adopt_republish_on_another_channel(amqp_conn: amqp.Connection, queue: str) -> None:
    first = ConfirmChannel(amqp_conn)
    t = Tracker()
    for i in range(5):
        first.publish(_msg(f"e{i}"), "", queue, t)
    # As if the channel had died now. py-amqp reads confirms before each publish, so the
    # earlier ones may be settled already; the last one cannot be.
    items = first.take()
    assert 1 <= len(items) == t.outstanding and first.pending == {}
    assert items[-1].entry == "e4"
    second = ConfirmChannel(amqp_conn)
    for item in items:
        second.adopt(item)
    second.wait(timeout=10, tracker=t)
    assert t.outstanding == 0 and t.failures == []
    count = amqp_conn.channel().queue_declare(queue, passive=True).message_count
    assert count == 5 + len(items)  # at least once: the republished ones twice


def test_a_timeout_names_only_the_tracker_waited_for(confirm: ConfirmChannel, queue: str) -> None:
    mine, other = Tracker(), Tracker()
    confirm.publish(_msg("e1", headers={"id": "other"}), "", queue, other)
    confirm.publish(_msg("e2", headers={"id": "mine"}), "", queue, mine)  # last: not settled yet
    with pytest.raises(PublishTimeout) as err:
        confirm.wait(timeout=0, tracker=mine)
    assert err.value.failed == ["mine"]
    confirm.wait(timeout=10)
