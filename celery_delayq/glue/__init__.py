"""The Celery glue: where Celery's producer, tasks, requests and worker meet the ladder (docs/how-it-works.md).

It calls :mod:`celery_delayq.ladder` and :mod:`celery_delayq.rabbitmq`, which never call back up
into it; features are named extensions (:mod:`.extensions`), never imported here.
"""
