"""Exception types raised by celery_delayq.

Every error says what went wrong *and* what to do about it, so that an operator reading a traceback at 3 a.m.
does not need to open the source. All of them derive from :class:`DelayqError`, so callers can catch the family.
"""

from __future__ import annotations

from celery.exceptions import ImproperlyConfigured
from kombu.exceptions import OperationalError

__all__ = ["DelayqError", "InvalidDelay", "DelayTooLong", "InvalidName", "TopologyError", "TopologyMissing",
           "TopologyMismatch", "BrokerTooOld", "FileHandleBudgetExceeded", "FileHandleBudgetUnknown",
           "UnsupportedTransport", "UnroutableDestination", "PublishError", "PublishNacked", "PublishReturned",
           "PublishTimeout", "BrokerUnavailable", "SettingsError", "FormatTooNew"]


class DelayqError(Exception):
    """Base class of every celery_delayq error."""


class InvalidDelay(DelayqError, ValueError):
    """A countdown or eta that is not a usable point in time (NaN, infinite, wrong type)."""


class DelayTooLong(DelayqError, ValueError):
    """The delay exceeds what the configured ladder can hold.

    celery_delayq never truncates a delay silently: raise the ladder's
    ``delayq_levels`` or ``delayq_unit_ms`` instead.
    """


class InvalidName(DelayqError, ValueError):
    """A queue, exchange or routing key that RabbitMQ would reject (e.g. over 255 bytes)."""


class TopologyError(DelayqError):
    """The ladder on the broker is not usable as configured."""


class TopologyMissing(TopologyError):
    """An exchange or queue of the ladder does not exist on the broker (verify-only mode)."""


class TopologyMismatch(TopologyError):
    """A ladder entity exists with arguments other than this app expects."""


class BrokerTooOld(TopologyError):
    """The broker lacks a feature the configuration asks for (e.g. quorum-queue TTL before 3.10)."""


class FileHandleBudgetExceeded(TopologyError):
    """A new ladder would take RabbitMQ 3.x past its file-handle budget; nothing was created.

    Past that budget a 3.x node silently stops accepting connections for every
    client (:mod:`celery_delayq.rabbitmq.budget`). The message names the node, its
    open-files limit, the ladders on it, and the fixes.
    """


class FileHandleBudgetUnknown(TopologyError):
    """A new ladder on RabbitMQ 3.x whose file-handle cost nobody could check; nothing was created.

    Without the management API a process cannot see the broker's budget, so it does not create a ladder
    implicitly; ``celery -A APP delayq topology declare`` does it explicitly.
    """


class UnsupportedTransport(DelayqError):
    """The ladder needs RabbitMQ over AMQP 0-9-1 (kombu's ``pyamqp`` transport)."""


class UnroutableDestination(DelayqError):
    """The message's destination does not exist, so the ladder could never deliver it."""


class PublishError(DelayqError):
    """A ladder publish was not confirmed by the broker; the message is *not* scheduled.

    Subclasses say why. Celery's retry machinery sees these like any other
    publish failure, so ``retry_policy``/``autoretry_for`` still apply.
    """

    def __init__(self, message: str, *, failed: list[str] | None = None, entries: list[str] | None = None) -> None:
        super().__init__(message)
        #: What may not be scheduled, by the name the caller knows: the Celery task id
        #: (the message's ``id`` header), else its ``message_id``, else its ladder entry id.
        self.failed: list[str] = list(failed or [])
        #: The ladder entry ids (``x-delayq-entry``) of the same messages, in the same order.
        self.entries: list[str] = list(entries if entries is not None else self.failed)


class PublishNacked(PublishError):
    """The broker refused the message (basic.nack), e.g. a queue at its length limit."""


class PublishReturned(PublishError):
    """The broker could not route the message into the ladder (mandatory return)."""


class PublishTimeout(PublishError):
    """No confirm arrived in time; the message may or may not be scheduled."""


class BrokerUnavailable(PublishError, OperationalError):
    """The ladder could not connect to the broker; the named messages were NOT scheduled.

    Raised after one attempt per broker host, without sleeping, so a publish against a stopped broker fails
    about as fast as Celery's own. It is also a :class:`kombu.exceptions.OperationalError`, the error plain
    Celery raises there, so existing ``except OperationalError`` handlers keep working.
    """


class SettingsError(DelayqError, ImproperlyConfigured, ValueError):  # type: ignore[misc]  # Celery is untyped
    """A ``delayq_*`` setting has a value celery_delayq cannot use; nothing was started with it.

    Raised by :class:`~celery_delayq.config.DelayqConfig` (at run time and in Django's ``manage.py check``,
    which call the same code). The message names the setting, the value given (credentials masked) and the forms
    it accepts. It is also Celery's ``ImproperlyConfigured`` and a ``ValueError``, so existing handlers of
    either keep working.
    """

    def __init__(self, message: str, *, setting: str | None = None) -> None:
        super().__init__(message)
        #: The setting at fault (``"delayq_enabled"``), for reporters that spell it their way (Django's checks).
        self.setting = setting


class FormatTooNew(DelayqError):
    """Something on the broker was written in a newer format than this release reads; nothing was guessed.

    A newer celery_delayq wrote it (or something that is not celery_delayq wrote a
    version header). Upgrade this process to the release that wrote it; formats and
    their versions: :mod:`celery_delayq.ladder.formats`, ``docs/stability.md``.
    """

    def __init__(self, name: str, what: str, found: object, supported: int) -> None:
        super().__init__(
            f"{what} on the broker is in {name} format {found!r}, and this celery_delayq reads {name} "
            f"format {supported} and older: upgrade this process to the celery_delayq that wrote it "
            "(see docs/stability.md, 'On-broker formats')")
        #: The format (``ladder``, ``index``, ``cancel``, ``parked``), the version found and the newest read here.
        self.format = name
        self.found = found
        self.supported = supported
