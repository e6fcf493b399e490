"""``python -m celery_delayq.analytics --events DIR --out DIR [--master URL]``.

The command is the CLI's ``delayq report`` (:mod:`celery_delayq.cli.report`,
also ``celery -A APP delayq report``), so both spellings take the same options.
It is run by name, not imported: the CLI is the top floor and the analytics
import nothing of it (as the glue names its extensions).
"""

import importlib

if __name__ == "__main__":
    importlib.import_module("celery_delayq.cli.report").main()
