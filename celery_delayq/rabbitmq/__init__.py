"""The RabbitMQ edge: every declare, publish, confirm and management call of the ladder.

* :mod:`.topology`: declare and verify the ladder's exchanges and queues;
* :mod:`.publisher`: :class:`~celery_delayq.rabbitmq.publisher.LadderPublisher`,
  the ladder backend (confirmed, mandatory publishes into the ladder);
* :mod:`.confirms`, :mod:`.owned`: publisher confirms and the connections the package owns;
* :mod:`.placement`, :mod:`.management`, :mod:`.budget`, :mod:`.occupancy`:
  where queue leaders go, the management API, the broker's file-handle budget;
* :mod:`.recovery`, :mod:`.laps`, :mod:`.following`, :mod:`.registry`: a ladder
  that lost queues, messages that went round again, followers, per-process state;
* :mod:`.fixed`, :mod:`.native`: the other delay backends (one TTL queue per delay; the broker's own delays);
* :mod:`.delivery_limit`: how a parking queue is declared on each RabbitMQ version;
* :mod:`.status`, :mod:`.probe`: a read-only view of an app's ladder on its broker, passive declares;
* :mod:`.client`: py-amqp's names for the layers above, so that ``amqp`` is imported in this folder only;
* :mod:`.export`: the ladder as a definitions file.

It builds on :mod:`celery_delayq.ladder` and the root modules (config,
errors, signals, typing); it never imports the Celery glue, a feature or the CLI.
"""
