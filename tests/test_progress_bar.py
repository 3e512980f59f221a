"""The ingest command's progress bar: its ETA follows the rate since the first report."""

from __future__ import annotations

from server.cli.progress import ProgressBar


def test_eta_is_unknown_until_a_second_report_then_follows_the_rate() -> None:
    now = [100.0]
    bar = ProgressBar(clock=lambda: now[0], enabled=True)
    bar(64, 1000, "a.md")
    assert bar.eta(64, 1000) == "ETA --"
    now[0] += 10.0  # 64 more chunks in 10 s: 6.4 chunks/s, 872 left
    bar(128, 1000, "b.md")
    assert bar.eta(128, 1000) == "ETA 2m16s"
