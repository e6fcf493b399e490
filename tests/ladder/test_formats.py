"""Versions of the on-broker formats: a missing header reads as 0.1.0's version 1, a newer one is refused (pure)."""

from __future__ import annotations

import pytest

from celery_delayq import FormatTooNew
from celery_delayq.ladder import headers as H
from celery_delayq.ladder.formats import PARKED_FORMAT, VERSIONS, check_format, version_of

pytestmark = pytest.mark.pure


@pytest.mark.parametrize("name", sorted(VERSIONS))
def test_what_0_1_0_wrote_reads_as_version_1_and_this_release_reads_its_own(name: str) -> None:
    header = PARKED_FORMAT if name == "parked" else H.FORMAT
    assert version_of({}, name) == 1 and check_format({}, name) == 1  # type: ignore[arg-type]
    assert check_format({header: VERSIONS[name]}, name) == VERSIONS[name]  # type: ignore[arg-type]
    assert check_format({header: str(VERSIONS[name]).encode()}, name) == VERSIONS[name]  # type: ignore[arg-type]


@pytest.mark.parametrize("found", [VERSIONS["index"] + 1, 99, "2", "two", 0, -1, True, 1.5])
def test_a_newer_or_unreadable_version_is_refused_naming_the_format_and_the_upgrade(found: object) -> None:
    with pytest.raises(FormatTooNew) as caught:
        check_format({H.FORMAT: found}, "index")
    err = caught.value
    assert (err.format, err.found, err.supported) == ("index", found, VERSIONS["index"])
    text = str(err)
    assert "index format" in text and repr(found) in text and "upgrade" in text


def test_the_parked_format_has_a_header_of_its_own() -> None:
    """A parked message keeps the ladder headers it had: a newer ladder format is not a newer parked one."""
    assert check_format({H.FORMAT: 7}, "parked") == 1
    with pytest.raises(FormatTooNew):
        check_format({PARKED_FORMAT: 7}, "parked")


def test_every_pass_states_the_ladder_format() -> None:
    headers = H.stamp_pass({}, due=1.0, delay=1.0, entry="e", hops=2, exchange="", routing_key="q")
    assert headers[H.FORMAT] == VERSIONS["ladder"] == H.FORMAT_VERSION
