"""The Celery glue: where Celery's producer, tasks, requests and worker meet the ladder.

* :mod:`.integration`: :func:`~celery_delayq.glue.integration.install`, the one explicit hook;
* :mod:`.producer`: the kombu ``Producer`` subclass every publish of the app goes through;
* :mod:`.app_ladder`: :class:`~celery_delayq.glue.app_ladder.AppLadder`, the per-app
  ladder (settings, routing, the backend);
* :mod:`.task`, :mod:`.attempts`, :mod:`.request`, :mod:`.dedup`: delayed retries,
  their attempt counts, the raw message and exactly-once redelivery;
* :mod:`.queue_delays`: per-queue default delays;
* :mod:`.takeover`, :mod:`.message_check`: delayed messages published by others,
  moved into the ladder on arrival;
* :mod:`.extensions`: the features (cancels, parking, telemetry, metrics, the
  takeover) as named extensions with hooks, each keeping its state on the
  app's ladder; the glue names them and never imports a feature.

It is thin: it calls :mod:`celery_delayq.ladder` and :mod:`celery_delayq.rabbitmq`,
which never call back up into it.
"""
