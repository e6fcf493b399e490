"""``python -m celery_delayq.analytics --events DIR --out DIR [--master URL]``."""

from celery_delayq.analytics.cli import main

if __name__ == "__main__":
    main()
