"""The index's frame reader (:mod:`celery_delayq.index.frames`) agrees with py-amqp on any header table (pure)."""

from __future__ import annotations

import struct
from typing import Any

import amqp
from hypothesis import given, settings, strategies as st

from celery_delayq.index.frames import HeaderReader


_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**63 - 1), st.floats(allow_nan=False),
                     st.text(max_size=40))
_VALUES = st.one_of(_SCALARS, st.lists(_SCALARS, max_size=3), st.dictionaries(st.text(max_size=5), _SCALARS,
                                                                               max_size=3))


@settings(max_examples=200, deadline=None)
@given(headers=st.dictionaries(st.text(min_size=1, max_size=30), _VALUES, max_size=25),
       message_id=st.one_of(st.none(), st.text(max_size=30)),
       props=st.fixed_dictionaries({}, optional={"content_type": st.just("application/json"),
                                                 "content_encoding": st.just("utf-8"),
                                                 "delivery_mode": st.just(2), "priority": st.integers(0, 9),
                                                 "correlation_id": st.text(max_size=10),
                                                 "reply_to": st.text(max_size=10)}))
def test_frame_reader_agrees_with_py_amqp(headers: dict[str, Any], message_id: str | None,
                                          props: dict[str, Any]) -> None:
    if message_id is not None:
        props["message_id"] = message_id
    message = amqp.Message(b"body", application_headers=headers or None, **props)
    raw = message._serialize_properties()
    decoded = amqp.Message()
    decoded._load_properties(60, raw, 0)
    expected = decoded.properties.get("application_headers") or {}
    payload = struct.pack(">HHQ", 60, 0, 4) + raw
    wanted = list(headers)[::2] + ["absent"]
    got, mid = HeaderReader(wanted).read(payload)
    assert mid == decoded.properties.get("message_id")
    for key in wanted:
        if key not in expected:
            assert key not in got
        elif isinstance(expected[key], (list, dict)):
            assert got[key] is None
        else:
            assert got[key] == expected[key]
