"""``delayq doctor``: is it safe to switch this app to the ladder, or back? Read-only.

Each check answers one question an operator asks before a switch-over and
gives a :class:`Finding`: a status (``ok``, ``warn``, ``error``), a one-line
summary and the next step.

* :mod:`.finding`: the :class:`Finding` and what became of the management API.
* :mod:`.checks`: one pure ``*_finding`` function per check (no I/O).
* :mod:`.observe`: the read-only look at the broker, its management API and
  the workers, and :func:`classify`, which hands it to the checks.

:func:`diagnose` does both and returns the findings in :data:`CHECKS` order.
"""

from __future__ import annotations

from ..glue.app_ladder import AppLadder
from ..rabbitmq.client import Connection
from .checks import (
    NATIVE_DELIVERY_EXCHANGE, NATIVE_LEVELS, PLUGIN_MAX_DELAY_MS, activation_finding, broker_finding,
    feature_flags_finding, file_handles_finding, ladder_finding, leaders_finding, native_finding, native_queue_names,
    node_loss_finding,
    parking_finding, plugin_finding, quorum_reservations, worker_eta_finding,
)
from .finding import ACTIVATION_RULE, CHECKS, ERROR, OK, WARN, ApiReach, Finding
from .observe import Observations, classify, observe, probe_plain_process

__all__ = [
    "Finding", "ApiReach", "Observations", "CHECKS", "ACTIVATION_RULE", "OK", "WARN", "ERROR",
    "diagnose", "observe", "classify", "probe_plain_process",
    "broker_finding", "feature_flags_finding", "ladder_finding", "leaders_finding", "node_loss_finding",
    "file_handles_finding",
    "quorum_reservations", "parking_finding",
    "activation_finding", "worker_eta_finding", "native_finding", "plugin_finding",
    "NATIVE_LEVELS", "NATIVE_DELIVERY_EXCHANGE", "PLUGIN_MAX_DELAY_MS", "native_queue_names",
]


def diagnose(ladder: AppLadder, raw: Connection, *, inspect_timeout: float = 1.0,
             app_spec: str | None = None) -> list[Finding]:
    """Observe (read-only) and classify: the doctor's findings for the ladder's app."""
    return classify(observe(ladder, raw, inspect_timeout=inspect_timeout, app_spec=app_spec))
