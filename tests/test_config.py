"""Settings: typed and validated in one place (``DelayqConfig``), unknown keys reported once per app.

Every ``delayq_*`` setting goes through :data:`celery_delayq.config.CONVERTERS`,
whoever reads it (the config, the activation hook, Django's checks): booleans
take exactly Celery's own forms, numbers and names are checked, and a bad
value is one ``SettingsError`` line naming the setting, the value and what
it takes. The last tests publish and run real tasks: the parsed value alone
decides whether a delayed task waits in the ladder.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import time
import types
from typing import Any, Iterator

import amqp
import pytest
from celery import Celery
from celery.utils.serialization import strtobool
from helpers import drain, running_worker

import celery_delayq
from celery_delayq.config import BACKEND_ALIASES, CONVERTERS, SETTINGS, DelayqConfig, _lookup, mask_url, setting, unknown_settings
from celery_delayq.errors import SettingsError


def test_unknown_keys_in_every_spelling_get_the_closest_valid_key() -> None:
    keys = ["delayq_enable", "DELAYQ_LEVEL", "CELERY_DELAYQ_PERFIX", "delayq_prefix", "CELERY_DELAYQ_RADIX",
            "broker_url", "delayq_frobnicate", "PROJ_DELAYQ_ENABLED"]
    assert unknown_settings(keys) == [
        ("delayq_enable", "delayq_enabled"),
        ("DELAYQ_LEVEL", "DELAYQ_LEVELS"),
        ("CELERY_DELAYQ_PERFIX", "CELERY_DELAYQ_PREFIX"),
        ("delayq_frobnicate", None),
    ]
    assert unknown_settings(["PROJ_DELAYQ_ENABLE"], namespace="PROJ") == [("PROJ_DELAYQ_ENABLE", "PROJ_DELAYQ_ENABLED")]


def test_warns_once_per_app(caplog: pytest.LogCaptureFixture) -> None:
    app = Celery("cfg", set_as_current=False)
    app.conf.update(delayq_enable=True, delayq_prefix="ok")
    with caplog.at_level(logging.WARNING, logger="celery_delayq.config"):
        assert DelayqConfig.from_app(app).prefix == "ok"
        DelayqConfig.from_app(app)
    warnings = [r.getMessage() for r in caplog.records if r.name == "celery_delayq.config"]
    assert warnings == ["celery_delayq: unknown setting 'delayq_enable' is ignored; did you mean 'delayq_enabled'?"]
    caplog.clear()
    other = Celery("cfg2", set_as_current=False)
    other.conf.update(delayq_enable=True)
    with caplog.at_level(logging.WARNING, logger="celery_delayq.config"):
        DelayqConfig.from_app(other)
    assert len([r for r in caplog.records if r.name == "celery_delayq.config"]) == 1


def test_django_namespace_spelling_is_checked(caplog: pytest.LogCaptureFixture) -> None:
    class Settings:
        CELERY_DELAYQ_ENABLE = True
        CELERY_DELAYQ_PREFIX = "dj"

    app = Celery("cfgdj", set_as_current=False)
    app.config_from_object(Settings, namespace="CELERY")
    with caplog.at_level(logging.WARNING, logger="celery_delayq.config"):
        assert DelayqConfig.from_app(app).prefix == "dj"
    assert "did you mean 'CELERY_DELAYQ_ENABLED'?" in caplog.text


def test_valid_settings_are_quiet(caplog: pytest.LogCaptureFixture) -> None:
    app = Celery("cfgok", set_as_current=False)
    app.conf.update(delayq_enabled=True, DELAYQ_LEVELS=12)
    with caplog.at_level(logging.WARNING, logger="celery_delayq.config"):
        assert DelayqConfig.from_app(app).levels == 12
    assert not [r for r in caplog.records if r.name == "celery_delayq.config"]


# -- typed and validated once (issue #31, item 4) ------------------------------------------------------------------
BOOLEAN_SETTINGS = [name for name, default in SETTINGS.items() if isinstance(default, bool)]
#: Every spelling Celery's strtobool takes, in three cases, and what it means.
CELERY_FORMS = {form: value for word, value in {"true": True, "false": False, "yes": True, "no": False, "on": True,
                                                "off": False, "1": True, "0": False}.items()
                for form in (word, word.upper(), word.capitalize())}


def test_booleans_are_found_by_their_default() -> None:
    assert set(BOOLEAN_SETTINGS) == {"delayq_enabled", "delayq_declare", "delayq_park", "delayq_dedup", "delayq_index"}


@pytest.mark.parametrize("name", BOOLEAN_SETTINGS)
def test_a_boolean_takes_exactly_celerys_forms(name: str) -> None:
    field = name[len("delayq_"):]
    for form, expected in CELERY_FORMS.items():
        assert strtobool(form) is expected  # the installed Celery agrees with the table above
        assert getattr(DelayqConfig(**{field: form}), field) is expected, form
    for given, expected in ((True, True), (False, False), (1, True), (0, False)):
        assert getattr(DelayqConfig(**{field: given}), field) is expected


@pytest.mark.parametrize("bad", ["yes please", "", " true", "true ", "t", "y", "enabled", "2", "none", 2, -1, 1.0,
                                 0.0, [], ["true"], object])
def test_anything_else_is_refused_naming_the_setting_the_value_and_the_forms(bad: Any) -> None:
    with pytest.raises(SettingsError) as info:
        DelayqConfig(enabled=bad)
    message = str(info.value)
    assert message.startswith("delayq_enabled must be a boolean (true/false, yes/no, on/off, 1/0 (any case)")
    assert message.endswith(f"got {bad!r}") and "\n" not in message
    assert info.value.setting == "delayq_enabled"
    assert isinstance(info.value, ValueError)  # existing ``except ValueError`` handlers keep working
    if isinstance(bad, str) and bad:
        with pytest.raises(TypeError):
            strtobool(bad)  # Celery refuses it too


#: (setting, refused values, accepted value -> its typed form). Numbers: a string is read with int()/float(),
#: as Celery reads its own numeric settings from text; NaN, infinities, bools, fractions of integers,
#: and anything out of range are refused.
NUMBERS: list[tuple[str, list[Any], list[tuple[Any, Any]]]] = [
    ("unit_ms", ["ten", "", "1.5", 1.5, 0, -1, True, None.__class__, math.nan], [("10", 10), (5, 5)]),
    ("levels", ["many", 0, 2.0, False], [("12", 12)]),
    ("radix", [1, 37, "4.0", "x"], [("2", 2), (3, 3)]),
    ("shards", [0, 65, "two"], [("3", 3)]),
    ("confirm_timeout", ["soon", 0, -1, math.nan, math.inf, "nan", "inf", "-inf", True], [("2.5", 2.5), (3, 3.0)]),
    ("batch_window", [0, "1e3", 10.0], [("500", 500)]),
    ("max_delay", [0, -5, "forever", math.inf, "nan"], [("60", 60.0), (None, None)]),
    ("dedup_ttl", [0, "a day", math.nan], [("3600", 3600.0)]),
    ("metrics_port", [0, 65536, "http", 80.0, True], [("9100", 9100), (None, None)]),
    ("fixed_resolution", [0, -0.5, math.inf, "fine"], [("0.5", 0.5)]),
    ("fixed_max_delay", [0, "ten minutes", math.nan], [("600", 600.0)]),
    ("fixed_queues", [-1, 1.5, "many"], [("0", 0), ("8", 8)]),
    ("bucket_width", [0, 0.0005, math.inf, "a second"], [("0.25", 0.25), (2, 2.0)]),
    ("bucket_max_delay", [0, -1, math.nan], [("300", 300.0)]),
    ("bucket_queues", [-1, 2.5, "lots"], [("0", 0), ("128", 128), (None, None)]),
    ("bucket_grace", [0, 0.5, math.inf], [("60", 60.0)]),
    ("bucket_shards", [0, 65, "four"], [("4", 4), (None, None)]),
    ("bucket_after", [-1, 0.5, "some"], [("0", 0), ("100", 100)]),
    ("bucket_min_delay", [-1, math.nan, "long"], [("0", 0.0), (60, 60.0)]),
    ("recurring_after", [-1, 0.5, "often"], [("0", 0), ("100", 100)]),
]


@pytest.mark.parametrize("name,refused,accepted", NUMBERS, ids=[n[0] for n in NUMBERS])
def test_numbers_are_typed_and_bounded(name: str, refused: list[Any], accepted: list[tuple[Any, Any]]) -> None:
    for bad in refused:
        with pytest.raises(SettingsError, match=rf"^delayq_{name} must be (an integer|a finite number) .*, "
                                                rf"got {re.escape(repr(bad))}$"):
            DelayqConfig(**{name: bad})
    for given, typed in accepted:
        value = getattr(DelayqConfig(**{name: given}), name)
        assert value == typed and type(value) is type(typed), (given, value)


def test_every_numeric_setting_is_covered() -> None:
    numeric = {n for n, d in SETTINGS.items() if type(d) in (int, float)} | {"delayq_max_delay", "delayq_metrics_port",
                                                                                   "delayq_bucket_queues",
                                                                                   "delayq_bucket_shards"}
    assert {f"delayq_{n[0]}" for n in NUMBERS} == numeric


@pytest.mark.parametrize("name,bad,choices", [
    ("queue_type", "Quorum", "'auto', 'quorum', 'classic'"),
    ("parking_queue_type", "stream", "'auto', 'quorum', 'classic'"),
    ("leader_placement", "everywhere", "'spread', 'broker'"),
    ("backend", "ladders", f"{sorted(BACKEND_ALIASES)} or a 'module:Class' path"),  # every row of the table
    ("disabled_extensions", ["takeovers"], "['takeover', 'cancels', 'parking', 'telemetry', 'metrics']"),
    ("queue_backends", {"emails": "fixd"}, f"{sorted(BACKEND_ALIASES)} or a 'module:Class' path"),
    ("queue_delays", "slow=30", "a mapping of queue name to seconds"),
    ("park_on", [42], "exception classes or 'module.Name' strings"),
    ("prefix", "", "a string (not empty)"),
    ("prefix", 5, "a string (not empty)"),
    ("management_url", "localhost:15672", "an http:// or https:// URL"),
    ("management_url", "ftp://host/", "an http:// or https:// URL"),
    ("dedup_url", None.__class__, "a URL (not empty)"),
])
def test_enums_names_and_urls_are_checked(name: str, bad: Any, choices: str) -> None:
    with pytest.raises(SettingsError) as info:
        DelayqConfig(**{name: bad})
    assert str(info.value).startswith(f"delayq_{name}") and choices in str(info.value), str(info.value)


def test_a_refused_url_is_shown_without_its_password() -> None:
    with pytest.raises(SettingsError) as info:
        DelayqConfig(management_url="monitor:hunter2secret@rabbit:15672")
    assert "hunter2secret" not in str(info.value) and "'monitor:**@rabbit:15672'" in str(info.value)
    with pytest.raises(SettingsError) as info:
        DelayqConfig(management_url="http://monitor:hunter2secret@rabbit:port")
    assert "hunter2secret" not in str(info.value)


def test_a_shape_each_number_allows_but_not_together_is_refused() -> None:
    with pytest.raises(SettingsError, match="do not make a usable ladder: the top level's TTL"):
        DelayqConfig(levels=30)


def test_every_setting_has_one_converter_and_its_default_passes_it() -> None:
    assert set(CONVERTERS) == {n[len("delayq_"):] for n in SETTINGS}
    assert DelayqConfig() == DelayqConfig(**{n[len("delayq_"):]: d for n, d in SETTINGS.items()})


def test_the_settings_as_celery_and_django_give_them_are_typed_the_same_everywhere() -> None:
    """What a config module or Django (``CELERY_DELAYQ_*``, strings from the environment) gives, read three ways."""
    class Settings:
        CELERY_DELAYQ_ENABLED = "false"
        CELERY_DELAYQ_UNIT_MS = "20"
        CELERY_DELAYQ_CONFIRM_TIMEOUT = "7.5"
        CELERY_DELAYQ_INDEX = "off"
        CELERY_DELAYQ_DISABLED_EXTENSIONS = "takeover"

    app = Celery("cfgtyped", set_as_current=False)
    app.config_from_object(Settings, namespace="CELERY")
    config = DelayqConfig.from_app(app)
    assert (config.enabled, config.unit_ms, config.confirm_timeout, config.index, config.disabled_extensions) == \
        (False, 20, 7.5, False, ("takeover",))
    for name in ("enabled", "unit_ms", "confirm_timeout", "index", "disabled_extensions"):
        assert setting(app, name) == getattr(config, name) == _lookup(app.conf, f"delayq_{name}")
    assert setting(app, "levels") == 14  # unset: the default
    assert _lookup(app.conf, "delayq_levels") is None
    with pytest.raises(KeyError, match="'delayq_enable' is not a celery_delayq setting"):
        setting(app, "delayq_enable")


def test_a_bad_value_fails_every_reader_with_the_same_error() -> None:
    app = Celery("cfgbad", set_as_current=False)
    app.conf.update(delayq_enabled="yes please")
    errors = []
    for read in (lambda: DelayqConfig.from_app(app), lambda: setting(app, "enabled"),
                 lambda: _lookup(app.conf, "delayq_enabled"), lambda: celery_delayq.is_installed(app)):
        with pytest.raises(SettingsError) as info:
            read()
        errors.append(str(info.value))
    assert len(set(errors)) == 1 and "'yes please'" in errors[0]
    assert celery_delayq.ladder_for(app).installed is False  # never turned on by a value it cannot read


@pytest.mark.parametrize("url,shown", [
    ("amqp://guest:s3cret@rabbit:5672/%2F", "amqp://guest:**@rabbit:5672/%2F"),
    ("amqp://a:s3cret@h1//;amqp://b:s3cret@h2//", "amqp://a:**@h1//;amqp://b:**@h2//"),
    ("http://mon:p%40s3cret@h:15672/", "http://mon:**@h:15672/"),
    ("http://mon:p@s3cret@h:15672", "http://mon:**@h:15672"),
    ("redis://:s3cret@localhost:6379/0", "redis://:**@localhost:6379/0"),
    ("mon:s3cret@h:15672", "mon:**@h:15672"),
    ("http://h:port:s3cret@h/", "http://h:**@h/"),
    ("http://mon@h:15672", "http://mon@h:15672"),
    ("http://h:15672", "http://h:15672"),
    ("", ""),
])
def test_mask_url_hides_every_password_and_keeps_the_rest(url: str, shown: str) -> None:
    assert mask_url(url) == shown
    assert "s3cret" not in mask_url(url)


# -- the setting alone decides, on a real broker and a real worker -----------------------------------------------
def _namespaced(broker_url: str, prefix: str, queue: str, value: str) -> Celery:
    """An app configured as Django does it: ``CELERY_*`` names, values as strings from the environment."""
    settings = types.SimpleNamespace(CELERY_BROKER_URL=broker_url, CELERY_DELAYQ_ENABLED=value,
                                     CELERY_DELAYQ_PREFIX=prefix, CELERY_TASK_DEFAULT_QUEUE=queue,
                                     CELERY_BROKER_HEARTBEAT=0)
    app = Celery("cfgdj", set_as_current=False)
    app.config_from_object(settings, namespace="CELERY")
    return app


def noop() -> None:
    """The published task's body (never run here)."""


@pytest.fixture
def destination(uid: str, amqp_conn: amqp.Connection) -> Iterator[str]:
    name = f"cfg.{uid}"
    ch = amqp_conn.channel()
    ch.queue_declare(name, durable=True, auto_delete=False)
    yield name
    with contextlib.suppress(Exception):
        ch.queue_delete(name)


@pytest.mark.parametrize("value,ladder", [("false", False), ("0", False), ("Off", False), ("true", True),
                                          ("YES", True)])
@pytest.mark.parametrize("how", ["conf.update", "django namespace"])
def test_the_parsed_value_decides_where_a_delayed_publish_waits(
        value: str, ladder: bool, how: str, broker_url: str, prefix: str, destination: str, uid: str,
        amqp_conn: amqp.Connection) -> None:
    if how == "conf.update":
        app = Celery("cfgpub", set_as_current=False)
        app.conf.update(broker_url=broker_url, delayq_enabled=value, delayq_prefix=prefix,
                        task_default_queue=destination, broker_heartbeat=0)
    else:
        app = _namespaced(broker_url, prefix, destination, value)
    try:
        assert celery_delayq.is_installed(app) is ladder
        task = app.task(name=f"cfg.{uid}", shared=False)(noop)
        sent = time.time()
        result = task.apply_async(countdown=1)
        (m,) = drain(amqp_conn, destination, 1, timeout=20)
        assert m.headers["id"] == result.id
        if ladder:
            assert "x-delayq-entry" in m.headers and m.arrived >= float(m.headers["x-delayq-due"])
        else:  # classic ETA: in the destination at once, the eta for the worker to hold
            assert "x-delayq-entry" not in m.headers and m.headers["eta"] and m.arrived - sent < 1
    finally:
        celery_delayq.uninstall(app)


@pytest.mark.parametrize("value,ladder", [("false", False), ("true", True)])
def test_a_worker_started_with_the_setting_alone_follows_its_value(value: str, ladder: bool, make_app: Any,
                                                                    uid: str) -> None:
    app = make_app(delayq_enabled=value)
    seen: list[Any] = []

    @app.task(bind=True, name=f"cfgw.{uid}")
    def probe(self: Any) -> None:
        seen.append(self.request.get("x-delayq-entry"))

    with running_worker(app):
        probe.apply_async(countdown=1)
        deadline = time.time() + 20
        while not seen and time.time() < deadline:
            time.sleep(0.05)
    assert len(seen) == 1, "the task did not run"
    assert (seen[0] is not None) is ladder, f"delayq_enabled={value!r}: ladder entry {seen[0]!r}"


def test_the_extension_names_config_accepts_are_the_glues() -> None:
    from celery_delayq.config import EXTENSION_NAMES
    from celery_delayq.glue.extensions import EXTENSIONS

    assert EXTENSION_NAMES == tuple(EXTENSIONS)


@pytest.mark.pure
@pytest.mark.parametrize("given, shapes", [
    ("14x4", ((14, 4),)), (["14x4", "7X16"], ((14, 4), (7, 16))), ([14, 4], ((14, 4),)), ([[14, 4]], ((14, 4),)),
    (["14x4", "14x4"], ((14, 4),)), ((), ()), (None, ()),
])
def test_previous_shapes_take_the_forms_people_write(given: object, shapes: tuple[tuple[int, int], ...]) -> None:
    config = DelayqConfig(previous_shapes=given)  # type: ignore[arg-type]
    assert config.previous_shapes == shapes
    assert [(s.levels, s.radix) for s in config.previous_specs] == [s for s in shapes if s != (14, 4)]
    assert [old.spec.namespace for old in config.layout.previous] == [f"delayq.{l}x{r}" for l, r in shapes
                                                                      if (l, r) != (14, 4)]


@pytest.mark.pure
@pytest.mark.parametrize("given", ["14", "14x", "x4", "14x1", "14x40", "0x4", [14], ["14x4", 7], "fourteen by four",
                                   [True, 4], 14])
def test_a_previous_shape_that_is_not_one_is_refused_naming_the_setting(given: object) -> None:
    with pytest.raises(SettingsError, match="delayq_previous_shapes.*LEVELSxRADIX"):
        DelayqConfig(previous_shapes=given)  # type: ignore[arg-type]
