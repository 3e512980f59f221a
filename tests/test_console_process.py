"""The console's log pages are built in a worker process owned by the lifespan of the app that
serves them: off the serving process's loop, stopped with the server, replaced when it dies; a
failing build is an error page, never a dead server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from server.config.settings import Settings
from server.console import app as console_module
from server.console.app import Console, console_app
from tests.test_console_pages import _no_runtime, write_log


def _gone(pid: int) -> bool:
    """The process ``pid`` has exited and been reaped (or never existed)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/status").exists() and "zombie" in Path(f"/proc/{pid}/status").read_text()


def _wait_gone(pid: int, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if _gone(pid):
            return True
        time.sleep(0.05)
    return False


def process_state(pid: int) -> str:
    """The process's state letter in /proc/PID/stat (T: stopped by a signal)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def stopped_within(pid: int, seconds: float = 10.0) -> bool:
    """The process is stopped by a signal (state T) within ``seconds``. A SIGSTOP takes effect
    when its target is next scheduled, not when it is sent, and an idle-priority worker on a busy
    machine can wait its turn for a while."""
    deadline = time.monotonic() + seconds
    while True:
        if process_state(pid) == "T":
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)


def killed_owner_leaves_no_worker(tmp_path: Path, owner: str, *, held: bool) -> bool:
    """Run ``owner`` (a script that starts a page process and prints its pid), check the worker
    is running (or, ``held``, stopped), kill the owner with SIGKILL: whether the worker is gone
    within 10 seconds after. A worker left behind is killed."""
    script = tmp_path / "owner.py"
    script.write_text(owner, encoding="utf-8")
    env = os.environ | {"PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    process = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, env=env, text=True)
    pid = 0
    try:
        assert process.stdout is not None
        pid = int(process.stdout.readline())
        if held:
            assert stopped_within(pid), f"the held page process is in state {process_state(pid)}"
        else:
            assert process_state(pid) != "T", "the page process is stopped"
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        return _wait_gone(pid, seconds=10)
    finally:
        process.kill()
        process.wait(timeout=30)
        if pid and not _wait_gone(pid, seconds=0.1):  # the test failed: leave no orphan behind
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)


def _pid(client: TestClient, console: Console) -> int:
    """The console's page process id, waiting (bounded) for it to start."""
    portal = client.portal
    assert portal is not None
    return portal.start_task_soon(console.pages.pid).result(timeout=120)


def _calls_card(text: str) -> str:
    return text.split('id="calls">', 1)[1][:80]


def test_with_its_lifespan_the_overview_is_built_in_another_process_that_stops_with_the_app(
    settings: Settings,
) -> None:
    write_log(settings.log_path)
    console = Console(settings.log_path, lambda: settings, _no_runtime)
    with TestClient(console_app(console)) as client:
        pid = _pid(client, console)
        assert pid != os.getpid() and not _gone(pid)
        overview = client.get("/console?since=all")
        sessions = client.get("/console/sessions?since=all")
        assert overview.status_code == 200 and "<b>4</b>" in _calls_card(overview.text)
        assert sessions.status_code == 200 and "s2" in sessions.text
        # The serving process's own running totals were never read: the worker built both pages.
        assert console._log_pages._digest.last_id == 0
    assert not console.pages.running
    assert _wait_gone(pid), "the page process outlived the app's lifespan"


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux-only")
def test_the_page_process_runs_at_the_idle_cpu_priority(settings: Settings) -> None:
    """A page waits for the lookups, not the other way round: the kernel runs it on idle cores only."""
    console = Console(settings.log_path, lambda: settings, _no_runtime)
    with TestClient(console_app(console)) as client:
        pid = _pid(client, console)
        assert os.sched_getscheduler(pid) == os.SCHED_IDLE
        assert os.sched_getscheduler(os.getpid()) != os.SCHED_IDLE


def test_a_killed_page_process_gives_an_error_page_and_the_next_page_a_new_process(
    settings: Settings,
) -> None:
    write_log(settings.log_path)
    console = Console(settings.log_path, lambda: settings, _no_runtime)
    with TestClient(console_app(console)) as client:
        pid = _pid(client, console)
        os.kill(pid, signal.SIGKILL)
        assert _wait_gone(pid)
        failed = client.get("/console?since=all")
        assert failed.status_code == 503 and "page process stopped" in failed.text
        again = client.get("/console?since=24h")
        assert again.status_code == 200 and "<b>4</b>" in _calls_card(again.text)
        assert client.portal.call(console.pages.pid) != pid  # type: ignore[union-attr]


def test_a_page_build_that_raises_is_an_error_page_and_the_console_keeps_serving(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_log(settings.log_path)

    def broken(*_: Any) -> str:
        raise ValueError("a bug in the page")

    # Without a lifespan the page is built in this process, where the patch applies.
    monkeypatch.setattr(console_module.pages, "overview_page", broken)
    client = TestClient(console_app(Console(settings.log_path, lambda: settings, _no_runtime)))
    failed = client.get("/console?since=all")
    assert failed.status_code == 500 and "could not be built" in failed.text
    assert "a bug in the page" not in failed.text
    assert client.get("/console/sessions?since=all").status_code == 200


def test_the_served_console_page_process_starts_and_stops_with_the_server(
    make_resources: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.test_console_worker import _served

    app, made = _served(make_resources, monkeypatch)
    with TestClient(app, base_url="http://127.0.0.1") as client:
        pid = _pid(client, made[0])
        assert pid != os.getpid() and not _gone(pid)
        assert client.get("/console?since=all").status_code == 200
    assert _wait_gone(pid), "the page process outlived the server"
