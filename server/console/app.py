"""The read-only web console: Starlette routes under ``/console``, thin handlers over the log's reads.

Mounted by ``serve`` beside ``/mcp`` (behind the same bearer-token and Host/Origin guards) and
served alone by ``lookup-knowledge-mcp console``. Only GET and HEAD are answered; every page
carries a Content-Security-Policy that allows no script and no fetch, so even markup that got
past the escaping could not run or call out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from server.cli.stats import StatsArgumentError, parse_since
from server.config.settings import Settings
from server.console import pages
from server.console.builder import LogPages, PageProcess, PageProcessStopped
from server.container import Runtime
from server.gap_report import GapReport, GapReporter
from storage.schema import SchemaVersionError

logger = logging.getLogger(__name__)

DEFAULT_WINDOW = "7d"
# A page is rendered at most this often per address: a console left reloading, or many people
# looking at once, costs the process serving lookups one render per page and period, not one per
# request (the figures are then at most this old).
PAGE_TTL_S = 2.0
PAGES_KEPT = 64
HEADERS = {
    "content-security-policy": "default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
    "frame-ancestors 'none'; form-action 'none'; base-uri 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
    "x-frame-options": "DENY",
}


class ConsoleUnavailable(RuntimeError):
    """The retrieval stack could not be opened; pages that need it say so."""


class ReportPending(Exception):
    """The window's first gap report is being built; the page asks the browser to come back."""


class Console:
    """The console's data: the log at ``log_path``, the live settings and the retrieval stack."""

    def __init__(
        self, log_path: Path, settings: Callable[[], Settings], runtime: Callable[[], Awaitable[Runtime]]
    ) -> None:
        self.log_path = log_path
        self._settings = settings
        self._runtime = runtime
        self._reporter: GapReporter | None = None
        self.pages = PageProcess()
        self._log_pages = LogPages(log_path)
        self._pages: dict[tuple[str, str, bool], tuple[float, str]] = {}
        self._renders: dict[tuple[str, ...], tuple[GapReport, object, str]] = {}

    def cached_page(self, path: str, query: str) -> str | None:
        """A page rendered less than PAGE_TTL_S ago for the same address (and query-text setting)."""
        hit = self._pages.get((path, query, self.show_queries))
        return hit[1] if hit is not None and time.monotonic() - hit[0] < PAGE_TTL_S else None

    def keep_page(self, path: str, query: str, body: str) -> None:
        if len(self._pages) >= PAGES_KEPT:
            self._pages.clear()
        self._pages[(path, query, self.show_queries)] = (time.monotonic(), body)

    def rendered(
        self, key: tuple[str, ...], report: GapReport, extra: object, render: Callable[[], str]
    ) -> str:
        """A report page, rendered once per report (and ``extra``, compared by value) and variant ``key``.

        The gaps, documents and map pages change only when their report is rebuilt (at most once a
        minute): every other request of such a page costs a dictionary lookup, not a render.
        """
        hit = self._renders.get(key)
        if hit is not None and hit[0] is report and hit[1] == extra:
            return hit[2]
        body = render()
        if len(self._renders) >= PAGES_KEPT:
            self._renders.clear()
        self._renders[key] = (report, extra, body)
        return body

    @property
    def show_queries(self) -> bool:
        """Query text is shown only while it is logged (``log.log_queries``, hot)."""
        return self._settings().log.log_queries

    async def runtime(self) -> Runtime:
        """The retrieval stack, once warm (the first page may wait for the model to load)."""
        return await self._runtime()

    async def report(self, window: str, since: float | None) -> GapReport:
        """The window's gap report; ReportPending while its first build runs (it embeds questions)."""
        if self._reporter is None:
            self._reporter = GapReporter(await self.runtime(), self.log_path)
        report = await self._reporter.latest(since, log_queries=self.show_queries, window=window)
        if report is None:
            raise ReportPending(window)
        return report

    async def log_page(self, page: str, *args: Any) -> str:
        """The overview or sessions page (``LogPages.<page>``): by the page process while it runs.

        The process runs between the lifespan's start and stop (``running``); a console without
        one (a test's client that enters no lifespan) builds the page on its own event loop.
        """
        if self.pages.running:
            return await self.pages.build(self.log_path, page, *args)
        build: Callable[..., Awaitable[str]] = getattr(self._log_pages, page)
        return await build(*args)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The page process, for the life of the app that serves the console (its lifespan)."""
        self.pages.start()
        try:
            yield
        finally:
            # Waits for a page in progress: on a thread, so the loop finishes its other work.
            await asyncio.to_thread(self.pages.close)


def _window(request: Request) -> tuple[str, float | None]:
    """The page's window (``?since=24h|7d|30d|all`` or any ``stats --since`` value)."""
    text = request.query_params.get("since", DEFAULT_WINDOW)[:40]
    if text == "all":
        return text, None
    try:
        return text, parse_since(text)
    except StatsArgumentError:
        return DEFAULT_WINDOW, parse_since(DEFAULT_WINDOW)


def _html(body: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(body, status_code=status, headers=HEADERS)


def _page(
    build: Callable[[Console, Request, str, float | None], Awaitable[str]],
) -> Callable[[Request], Awaitable[Response]]:
    """A handler: the window parsed, the page built, a failure shown without paths or details."""

    async def handler(request: Request) -> Response:
        console: Console = request.app.state.console
        label, since = _window(request)
        started = time.perf_counter()
        path, query = request.url.path, request.url.query
        cached = console.cached_page(path, query)
        if cached is not None:
            return _html(cached)
        try:
            body = await build(console, request, label, since)
            console.keep_page(path, query, body)
        except ReportPending:
            return _html(pages.pending_page(request.url.path, label), 200)
        except Exception as exc:  # the top of a page: every failure is a page that says so
            return _failure(request.url.path, exc, label)
        logger.debug("console %s in %.1f ms", request.url.path, (time.perf_counter() - started) * 1000)
        return _html(body)

    return handler


def _failure(path: str, exc: Exception, label: str) -> HTMLResponse:
    """The page for a failed build: what failed, without paths or details (those go to the log)."""
    if isinstance(exc, ConsoleUnavailable):
        logger.warning("console page %s: %s", path, exc)
        text, status = "The knowledge base is unavailable; see the server log.", 503
    elif isinstance(exc, (SchemaVersionError, sqlite3.Error, OSError)):
        # The message names the file: it goes to the server's log, not to the page.
        logger.warning("console page %s failed: %s", path, exc)
        text, status = "The invocation log cannot be read; see the server log.", 503
    elif isinstance(exc, PageProcessStopped):
        logger.warning("console page %s: %s", path, exc)
        text, status = "The console's page process stopped; reload the page to start a new one.", 503
    else:
        logger.exception("console page %s failed", path)
        text, status = "The page could not be built; see the server log.", 500
    return _html(pages.message_page("Unavailable", text, label), status)


async def _overview(console: Console, _: Request, label: str, since: float | None) -> str:
    return await console.log_page("overview", label, since)


async def _gaps(console: Console, _: Request, label: str, since: float | None) -> str:
    report = await console.report(label, since)
    shown = console.show_queries

    def render() -> str:
        return pages.gaps_page(report if shown else report.model_copy(update={"groups": []}), label)

    return console.rendered(("gaps", label, str(shown)), report, None, render)


async def _documents(console: Console, request: Request, label: str, since: float | None) -> str:
    sort = request.query_params.get("sort", "delivered")
    descending = request.query_params.get("order", "desc") != "asc"
    report = await console.report(label, since)
    return console.rendered(
        ("documents", label, sort, str(descending)),
        report,
        None,
        lambda: pages.documents_page(report, label, sort, descending),
    )


async def _sessions(console: Console, _: Request, label: str, since: float | None) -> str:
    return await console.log_page("sessions", label, since, console.show_queries)


async def _map(console: Console, _: Request, label: str, since: float | None) -> str:
    runtime = await console.runtime()
    report = await console.report(label, since)
    delivered: dict[str, int] = {}
    for doc in report.documents.all:
        delivered[doc.domain or ""] = delivered.get(doc.domain or "", 0) + doc.delivered
    knowledge_map = await asyncio.to_thread(runtime.engine.knowledge_map)
    return console.rendered(
        ("map", label), report, knowledge_map, lambda: pages.map_page(knowledge_map, delivered, label)
    )


def console_app(console: Console) -> Starlette:
    """The console's routes, under ``/console``."""
    routes = [
        Route(pages.PREFIX + path, _page(build), methods=["GET", "HEAD"])
        for path, build in (
            ("", _overview),
            ("/", _overview),
            ("/gaps", _gaps),
            ("/documents", _documents),
            ("/sessions", _sessions),
            ("/map", _map),
        )
    ]

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        async with console.running():
            yield

    # Served alone (``console``), this app's lifespan owns the page process; mounted beside /mcp,
    # build_http_app enters ``console.running()`` in the server's lifespan instead.
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.console = console
    return app


class WithConsole:
    """Sends ``/console`` and below to the console, everything else to ``app`` (the MCP transport)."""

    def __init__(self, app: ASGIApp, console: ASGIApp) -> None:
        self.app = app
        self.console = console

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path == pages.PREFIX or path.startswith(pages.PREFIX + "/"):
            await self.console(scope, receive, send)
            return
        await self.app(scope, receive, send)
