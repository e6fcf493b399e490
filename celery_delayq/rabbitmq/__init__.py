"""The RabbitMQ edge: every declare, publish, confirm and management call of the ladder (modules: docs/how-it-works.md).

It builds on :mod:`celery_delayq.ladder` and the root modules (config, errors, signals, typing);
it never imports the Celery glue, a feature or the CLI. ``amqp`` is imported in this folder only.
"""
