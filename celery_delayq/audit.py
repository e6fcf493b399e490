"""One audit line for every action that changes production state: who, what, which ids.

The page, the API and the CLI all call :func:`audit` after an action (and for a refused one, :func:`audit` with
``refused=``), on the logger ``celery_delayq.audit`` at INFO, so an operator can route it to a file or a log
shipper of its own (``logging.getLogger("celery_delayq.audit")``). The line never carries a secret: a bearer
token is named by a short fingerprint (:func:`token_fingerprint`), never by its text.

    delayq audit: who=user:alice via=page action=cancel ids=2 [4f1c..., 9a0e...] filter="task proj.*"
"""

from __future__ import annotations

import getpass
import hashlib
import logging
from typing import Iterable

__all__ = ["audit", "token_fingerprint", "cli_actor", "LOGGER", "IDS_SHOWN"]

#: The logger every audit line goes to.
LOGGER = "celery_delayq.audit"
#: How many ids one line lists before "+N more".
IDS_SHOWN = 20

log = logging.getLogger(LOGGER)


def token_fingerprint(token: str) -> str:
    """``token:`` and the first 8 hex digits of the token's SHA-256: who, without the secret."""
    return "token:" + hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()[:8]


def cli_actor() -> str:
    """The operating-system user running a CLI command (``cli:root``)."""
    try:
        return f"cli:{getpass.getuser()}"
    except Exception:  # no user name in a container: the uid still says something
        import os

        return f"cli:uid{os.getuid()}"


def _value(value: object) -> str:
    text = str(value)
    return f'"{text}"' if (not text or any(c.isspace() for c in text)) else text


def audit(action: str, *, who: str, via: str, ids: Iterable[str] = (), refused: str | None = None,
          **details: object) -> str:
    """Log (and return) the audit line of one action; ``refused``: why nothing was done."""
    shown = list(ids)
    listed = ", ".join(shown[:IDS_SHOWN]) + (f", +{len(shown) - IDS_SHOWN} more" if len(shown) > IDS_SHOWN else "")
    parts = [f"who={_value(who)}", f"via={via}", f"action={_value(action)}", f"ids={len(shown)}" + (f" [{listed}]" if shown else "")]
    parts += [f"{key}={_value(val)}" for key, val in details.items() if val is not None and val != ""]
    if refused:
        parts.append(f"refused={_value(refused)}")
    line = "delayq audit: " + " ".join(parts)
    log.info("%s", line)
    return line
