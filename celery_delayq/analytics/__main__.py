"""``python -m celery_delayq.analytics --events DIR --out DIR [--master URL]``: the CLI's ``delayq report``,
run by name (the analytics import nothing of the CLI)."""

import importlib

if __name__ == "__main__":
    importlib.import_module("celery_delayq.cli.report").main()
