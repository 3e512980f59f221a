"""The console's log pages (overview, sessions) of one log file, over running totals kept between pages.

Those two pages change with every row the server logs, so no cache can spare their work: the
log's running totals are brought up to date, a window is summarised, 50 sessions' calls are read
and the HTML and SVG are rendered. The console's page process keeps one ``LogPages`` per log
file (its running totals persist between pages); a console without that process keeps its own.
"""

from __future__ import annotations

from pathlib import Path

from server.console import pages
from storage import usage_queries
from storage.log_digest import LogDigest, Overview
from storage.log_reads import log_position, read_only

SESSIONS_SHOWN = 100
SESSION_DETAILS = 50
LOG_PAGES = ("overview", "sessions")


class LogPages:
    """The overview and sessions pages of one log file, over running totals kept between pages."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self._digest = LogDigest()

    async def digest(self) -> LogDigest:
        """The log's running totals, with the rows written since the last page folded in."""
        async with read_only(self.log_path) as conn:
            if await log_position(conn) < self._digest.last_id:  # the log was recreated
                self._digest = LogDigest()
            await self._digest.refresh(conn)
        return self._digest

    async def page(self, name: str, *args: object) -> str:
        """The page ``name`` (one of LOG_PAGES) with its arguments."""
        if name == "overview":
            label, since = args
            return await self.overview(str(label), _since(since))
        if name == "sessions":
            label, since, show_queries = args
            return await self.sessions(str(label), _since(since), bool(show_queries))
        raise ValueError(f"no log page {name!r}")

    async def overview(self, label: str, since: float | None) -> str:
        if not self.log_path.exists():
            return pages.overview_page(Overview(bucket_seconds=3600), label)
        return pages.overview_page((await self.digest()).overview(since), label)

    async def sessions(self, label: str, since: float | None, show_queries: bool) -> str:
        if not self.log_path.exists():
            return pages.sessions_page([], {}, label, show_queries)
        rows = (await self.digest()).active_sessions(since, SESSIONS_SHOWN)
        async with read_only(self.log_path) as conn:
            calls = await usage_queries.session_calls(conn, [s.session_key for s in rows[:SESSION_DETAILS]])
        return pages.sessions_page(rows, calls, label, show_queries)


def _since(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) else None
