"""``delayq doctor``: is it safe to switch this app to the ladder, or back? Read-only.

Each check gives a :class:`Finding` (status, one-line summary, next step): pure ``*_finding``
functions in :mod:`.checks`, fed by :mod:`.observe`; :func:`diagnose` does both, in :data:`CHECKS` order.
"""

from __future__ import annotations

from .checks import (
    NATIVE_DELIVERY_EXCHANGE, NATIVE_LEVELS, PLUGIN_MAX_DELAY_MS, activation_finding, broker_finding,
    feature_flags_finding, file_handles_finding, ladder_finding, leaders_finding, native_finding, native_queue_names,
    node_loss_finding, parking_finding, plugin_finding, quorum_reservations, worker_eta_finding,
)
from .finding import ACTIVATION_RULE, CHECKS, ERROR, OK, WARN, ApiReach, Finding
from .observe import Observations, classify, diagnose, observe, probe_plain_process

__all__ = [
    "Finding", "ApiReach", "Observations", "CHECKS", "ACTIVATION_RULE", "OK", "WARN", "ERROR", "diagnose", "observe",
    "classify", "probe_plain_process", "broker_finding", "feature_flags_finding", "ladder_finding", "leaders_finding",
    "node_loss_finding", "file_handles_finding", "quorum_reservations", "parking_finding", "activation_finding",
    "worker_eta_finding", "native_finding", "plugin_finding", "NATIVE_LEVELS", "NATIVE_DELIVERY_EXCHANGE",
    "PLUGIN_MAX_DELAY_MS", "native_queue_names",
]
