"""What the doctor reports: a :class:`Finding` per check, and whether the management API could be asked."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["OK", "WARN", "ERROR", "CHECKS", "ACTIVATION_RULE", "Finding", "ApiReach"]

OK, WARN, ERROR = "ok", "warn", "error"

#: The order findings are reported in (also their ``check`` names).
CHECKS = ("broker", "feature_flags", "ladder", "leaders", "node_loss", "file_handles", "parking", "activation", "worker_eta",
          "native_delayed_delivery", "plugin_exchanges")

#: How an app's delayed publishes reach the ladder (the integration module's rule, in one sentence).
ACTIVATION_RULE = ("The setting alone turns it on: processes that imported celery_delayq publish into the ladder "
                   "themselves; a worker of the app moves any other delayed task into the ladder on arrival and "
                   "tells you which publisher to fix.")

@dataclass(frozen=True)
class Finding:
    """One answer of the doctor.

    Attributes:
        check: Which check (one of :data:`CHECKS`).
        status: ``ok``, ``warn`` or ``error``.
        summary: One line: what was found.
        next_step: What to do about it (or why nothing needs doing).
        details: The observations behind it, for scripts (JSON-serialisable).
    """

    check: str
    status: str
    summary: str
    next_step: str
    details: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The finding as the ``--json`` object."""
        return asdict(self)


@dataclass(frozen=True)
class ApiReach:
    """What became of the attempt to reach RabbitMQ's management API.

    Attributes:
        url: The API's base URL (``None`` when switched off).
        state: ``ok``, ``off`` (``delayq_management_url = ""``), ``unreachable``,
            or ``other_broker`` (it answers, but for another broker than the AMQP one).
        answered_for: ``"cluster_name RabbitMQ version"`` the API answered for, when it did; for
            ``unreachable``, what became of the request (no answer, or the HTTP status it answered).
    """

    url: str | None
    state: str
    answered_for: str | None = None

    @property
    def usable(self) -> bool:
        """Can its answers be used for this broker?"""
        return self.state == "ok"

    def why_not(self) -> str:
        """Why the API's answers are not available, as a clause."""
        if self.state == "off":
            return "the management API is switched off (delayq_management_url = '')"
        if self.state == "other_broker":
            return f"the management API at {self.url} answers for another broker ({self.answered_for})"
        if self.refused:
            return f"RabbitMQ's management API at {self.url} refused the request: {self.answered_for}"
        return f"RabbitMQ's management API is not reachable at {self.url}"

    @property
    def refused(self) -> bool:
        """Did the API answer, with an error (a wrong password: 401), rather than not answer at all?"""
        return self.state == "unreachable" and (self.answered_for or "").startswith("it answered")

    def how_to_fix(self) -> str:
        """The next step that makes the API usable."""
        if self.state == "other_broker":
            return f"Set delayq_management_url to this broker's management API (now {self.url}, another broker's)."
        if self.refused:
            return ("Give delayq_management_url a user and password the API accepts "
                    "(http://USER:PASSWORD@HOST:15672; percent-encode special characters), of a user with the "
                    "'monitoring' tag.")
        return ("Enable it on the broker (`rabbitmq-plugins enable rabbitmq_management`) and set "
                "delayq_management_url = 'http://HOST:15672' if it is not on the broker's host at port 15672; "
                "the user needs the 'monitoring' tag.")
