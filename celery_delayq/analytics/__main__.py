"""``python -m celery_delayq.analytics --events DIR --out DIR [--master URL]``.

The command itself is :mod:`celery_delayq.cli.report` (also ``celery -A APP
delayq report``), so both spellings take the same options.
"""

from celery_delayq.cli.report import main

if __name__ == "__main__":
    main()
