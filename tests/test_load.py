"""Load: 50 concurrent sessions x 20 lookups over streamable HTTP on loopback, against a real server process.

Passes with 0 protocol errors, 0 cross-session leaks and one log row per call; prints p50/p95.
The driver and its checks live in bench/load.py, which also runs larger loads.
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from bench.load import count_log_rows, drive, load_env
from tests.wire import private_data_dir, served_http

pytestmark = pytest.mark.slow

SESSIONS = 50
CALLS = 20
BOUND_S = 240.0  # the whole run; it takes well under a minute on two cores


def test_fifty_concurrent_sessions_get_answers_without_errors_leaks_or_lost_log_rows(
    tmp_path: Path, sample_template: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data_dir = private_data_dir(sample_template, tmp_path / "data")
    with served_http(load_env(data_dir), tmp_path / "logs") as served:
        report = anyio.run(lambda: drive(served.url, sessions=SESSIONS, calls=CALLS, timeout_s=BOUND_S))
        count_log_rows(data_dir / "log.sqlite", report)
    summary = report.summary()
    with capsys.disabled():
        print("\nload test:", json.dumps(summary))

    assert report.calls == SESSIONS * CALLS
    assert report.protocol_errors == 0, report.errors[:5]
    assert report.tool_errors == 0, report.errors[:5]
    assert report.leaks == []
    assert report.deduped_documents > 0, "no session re-asked a topic: the leak check saw nothing"
    assert report.log_rows == report.calls
    assert len(report.log_rows_per_session) == SESSIONS
    assert set(report.log_rows_per_session.values()) == {CALLS}
    assert report.wall_s < BOUND_S
