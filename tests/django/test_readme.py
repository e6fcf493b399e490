"""examples/django_shop/README.md runs as written: its commands, in its order, with a real worker.

Only the broker's vhost, the queue and the ladder prefix are changed (through the
environment variables the example's settings read), so that the test is isolated.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from helpers import management_url

pytest.importorskip("django")

PROJECT = Path(__file__).resolve().parents[2] / "examples" / "django_shop"
README = (PROJECT / "README.md").read_text()


def _readme_commands() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", README, flags=re.S)
    return [line.split("#")[0].strip() for block in blocks for line in block.splitlines() if line.strip()]


def _argv(command: str) -> tuple[dict[str, str], list[str]]:
    """``VAR=value python ...`` / ``celery ...`` as argv for this interpreter."""
    env: dict[str, str] = {}
    words = command.split()
    while "=" in words[0]:
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    if words[0] == "python":
        return env, [sys.executable, *words[1:]]
    if words[0] == "celery":
        return env, [sys.executable, "-m", "celery", *words[1:]]
    raise AssertionError(f"unexpected command {command!r}")


def test_the_readme_runs_as_written(broker_url: str, uid: str, tmp_path: Path) -> None:
    commands = _readme_commands()
    expected = ["python manage.py check", "celery -A shop worker --loglevel INFO",
                "python manage.py remind 42 --in 5", "celery -A shop delayq status", "celery -A shop delayq topology delete --yes",
                "CELERY_BROKER_URL=redis://localhost:6379/0 python manage.py check"]
    assert [c for c in commands if c in expected] == expected, commands
    base = {k: v for k, v in os.environ.items() if not k.startswith(("CELERY_", "DJANGO_"))}
    base.update(CELERY_BROKER_URL=broker_url, SHOP_QUEUE=f"shop.{uid}", SHOP_DELAYQ_PREFIX=f"rd{uid}",
                SHOP_DELAYQ_MANAGEMENT_URL=management_url(),
                TZ="America/Chicago")  # a machine whose local time is not UTC

    def run(command: str) -> subprocess.CompletedProcess[str]:
        extra, argv = _argv(command)
        return subprocess.run(argv, env={**base, **extra}, cwd=PROJECT, capture_output=True, text=True, timeout=120)

    check = run(expected[0])
    assert check.returncode == 0 and "System check identified no issues" in check.stdout, check.stderr
    log = tmp_path / "worker.log"
    _, argv = _argv(expected[1])
    with log.open("w") as out:
        worker = subprocess.Popen(argv, env=base, cwd=PROJECT, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_for(log, "ladder 'rd", 60)
        sent = run(expected[2])
        assert sent.returncode == 0 and sent.stdout.startswith("order 42: reminder due at"), sent.stderr
        status = run(expected[3])
        assert status.returncode == 0 and f"rd{uid}" in status.stdout, status.stderr
        line = _wait_for(log, "reminder for order 42 sent", 60)
        late = float(re.search(r"sent, (-?[\d.]+) s after it was due", line).group(1))
        assert late >= 0
        # The log's clock reads the due time's clock (UTC), though this shell's TZ is 6 hours off.
        logged = datetime.strptime(re.match(r"\[([\d-]+ [\d:]+),", line).group(1), "%Y-%m-%d %H:%M:%S")
        due = datetime.fromisoformat(re.search(r"after it was due \((\S+)\)", line).group(1))
        assert abs(logged.replace(tzinfo=timezone.utc) - due) < timedelta(seconds=30), line
        printed = datetime.fromisoformat(sent.stdout.split("reminder due at ")[1].split()[0])
        assert abs(printed - due) < timedelta(seconds=2), (sent.stdout, line)
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
    deleted = run(expected[4])
    assert deleted.returncode == 0 and "deleted" in deleted.stdout, deleted.stderr
    redis = run(expected[5])
    assert redis.returncode == 1 and "(celery_delayq.E001)" in redis.stderr
    shown = [line for line in redis.stderr.splitlines() if "celery_delayq.E001" in line or "HINT" in line]
    assert shown and all(line in README for line in shown), shown  # the README shows what it prints


def _wait_for(log: Path, text: str, timeout: float) -> str:
    deadline = time.time() + timeout
    while time.time() < deadline:
        for line in log.read_text().splitlines():
            if text in line:
                return line
        time.sleep(0.2)
    raise AssertionError(f"{text!r} not in the worker's log within {timeout} s:\n{log.read_text()[-3000:]}")
