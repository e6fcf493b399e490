"""The pure ladder: its shape, arithmetic, headers and words, with no I/O.

* :mod:`.spec`: :class:`~celery_delayq.ladder.spec.LadderSpec`, the frozen,
  checked model of the ladder (levels, digits, TTLs, names, routing keys);
* :mod:`.delays`: a countdown or an eta turned into one due time;
* :mod:`.headers`: the ``x-delayq-*`` header names and their stamping;
* :mod:`.entries`: the id of each pass (:data:`~celery_delayq.ladder.headers.ENTRY`);
* :mod:`.index_layout`: names and arguments of the index and cancel streams;
* :mod:`.humanize`: durations and ladders in words;
* :mod:`.moments`: operators' time words ("in 2h", ISO 8601) as epoch seconds;
* :mod:`.plugin_compat`: the ``x-delay`` header of RabbitMQ's delayed-message plugin.

Nothing here opens a connection or imports Celery, so everything can be
tested (and property-tested) without a broker. It imports nothing of the
package but :mod:`celery_delayq.errors`; ``tests/test_import_graph.py`` holds it to that.
"""
