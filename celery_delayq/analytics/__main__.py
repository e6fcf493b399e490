"""``python -m celery_delayq.analytics --events DIR --out DIR [--master URL]``: the report's command
(:mod:`.command`, which ``delayq report`` is too)."""

from .command import main

if __name__ == "__main__":
    main()
