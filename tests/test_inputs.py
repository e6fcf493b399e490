"""The one input model of every operator action (:mod:`celery_delayq.inputs`) and the audit line."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given, strategies as st

from celery_delayq.audit import IDS_SHOWN, audit, token_fingerprint
from celery_delayq.config import DelayqConfig
from celery_delayq.errors import DelayTooLong
from celery_delayq.inputs import BadInput, check_id, parse_delay, parse_due, require_selection
from celery_delayq.ladder.moments import parse_moment

NOW = 1_800_000_000.0


@pytest.mark.parametrize("text", ["", "   ", None])
def test_an_empty_due_is_an_error_not_now(text: str | None) -> None:
    with pytest.raises(BadInput, match="due: empty"):
        parse_due(text, now=NOW)


@pytest.mark.parametrize("text", ["-5m", "0s", "2000-01-01", str(int(NOW) - 1), "-1w"])
def test_a_past_due_names_run_now(text: str) -> None:
    with pytest.raises(BadInput, match="run-now"):
        parse_due(text, now=NOW)


@pytest.mark.parametrize("text", ["99999999999999999999", "999999999999", "1e400", "nan", "9999999999999999999d"])
def test_an_enormous_due_is_a_clear_error_never_an_overflow(text: str) -> None:
    with pytest.raises((BadInput, DelayTooLong)) as caught:
        parse_due(text, now=NOW, check_delay=DelayqConfig().check_delay)
    assert text[:10] in str(caught.value) or "longer than" in str(caught.value)


def test_a_due_beyond_the_apps_limit_is_delay_too_long() -> None:
    config = DelayqConfig(max_delay=3600)
    assert parse_due("30m", now=NOW, check_delay=config.check_delay) == NOW + 1800
    with pytest.raises(DelayTooLong, match="delayq_max_delay"):
        parse_due("2h", now=NOW, check_delay=config.check_delay)


def test_a_due_in_the_future_in_every_form() -> None:
    assert parse_due("90s", now=NOW) == NOW + 90
    assert parse_due(str(int(NOW) + 60), now=NOW) == NOW + 60
    assert parse_due(NOW + 5, now=NOW) == NOW + 5
    assert parse_due("2030-01-15T00:00:00Z", now=NOW) == parse_moment("2030-01-15", direction="ahead")


@pytest.mark.parametrize("value", [True, False])
def test_a_boolean_is_not_a_due_time(value: bool) -> None:
    with pytest.raises(BadInput):
        parse_due(value, now=NOW)


@pytest.mark.parametrize("text,seconds", [("0", 0.0), ("5", 5.0), ("1.5", 1.5), ("10m", 600.0), ("2h", 7200.0)])
def test_delays(text: str, seconds: float) -> None:
    assert parse_delay(text) == seconds


@pytest.mark.parametrize("text", ["", "-5", "-5m", "+5m", "2026-01-01", "soon", "1e400", "nan"])
def test_bad_delays(text: str) -> None:
    with pytest.raises(BadInput, match="delay"):
        parse_delay(text)


@pytest.mark.parametrize("value,why", [("", "empty"), ("a" * 256, "at most 255"), ("\udcff", "UTF-8"),
                                       ("a\x00b", "control"), ("a\u200bb", "control"), (5, "not text")])
def test_bad_ids(value: object, why: str) -> None:
    with pytest.raises(BadInput, match=why):
        check_id(value, what="task id")


def test_an_id_is_trimmed() -> None:
    assert check_id("  4f1c-9a  ") == "4f1c-9a"


def test_an_empty_selection_never_means_everything() -> None:
    with pytest.raises(BadInput, match="no filter"):
        require_selection(described="", everything=False, dry_run=True, expect=None)
    with pytest.raises(BadInput, match="cannot be combined"):
        require_selection(described="task x", everything=True, dry_run=True, expect=None)
    with pytest.raises(BadInput, match="expect"):
        require_selection(described="task x", everything=False, dry_run=False, expect=None)
    with pytest.raises(BadInput, match="not a count"):
        require_selection(described="", everything=True, dry_run=False, expect=-1)
    require_selection(described="", everything=True, dry_run=False, expect=3)
    require_selection(described="task x", everything=False, dry_run=True, expect=None)


@given(st.text(max_size=40))
def test_any_text_is_a_due_time_or_a_bad_input(text: str) -> None:
    try:
        due = parse_due(text, now=NOW, check_delay=DelayqConfig().check_delay)
    except (BadInput, DelayTooLong):
        return
    assert due > NOW


@given(st.text(max_size=40))
def test_any_text_is_a_delay_or_a_bad_input(text: str) -> None:
    try:
        seconds = parse_delay(text)
    except BadInput:
        return
    assert seconds >= 0


def test_the_audit_line_says_who_what_which_and_never_the_token(caplog: pytest.LogCaptureFixture) -> None:
    secret = "s3cret-token-of-32-characters-xx"
    ids = [f"id-{i}" for i in range(IDS_SHOWN + 5)]
    with caplog.at_level(logging.INFO, logger="celery_delayq.audit"):
        line = audit("cancel", who=token_fingerprint(secret), via="api", ids=ids, filter="task proj.*")
    assert caplog.messages == [line]
    assert secret not in line and token_fingerprint(secret) in line
    assert "action=cancel" in line and f"ids={len(ids)} [id-0, " in line and "+5 more" in line
    assert 'filter="task proj.*"' in line
    assert "refused=" in audit("cancel", who="loopback", via="page", refused="no filter")
