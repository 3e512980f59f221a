"""The read-only web console: Starlette routes under ``/console``, thin handlers over the log's reads.

Mounted by ``serve`` beside ``/mcp`` (behind the same bearer-token and Host/Origin guards) and
served alone by ``lookup-knowledge-mcp console``. Only GET and HEAD are answered; every page
carries a Content-Security-Policy that allows no script and no fetch, so even markup that got
past the escaping could not run or call out.

While the console's page process runs (``server.console.builder``), every page is built there
and this process only forwards the request and sends the bytes; and at most PAGES_IN_FLIGHT
pages are built at once, PAGES_WAITING more wait, and any further request is answered at once
with 503 and Retry-After (``ConsoleBusy``), so a burst of page loads queues no work here.
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
from server.console._worker import ReportSpec
from server.console.builder import PageProcess, PageProcessStopped
from server.console.log_pages import LogPages
from server.console.pause import LookupPause
from server.console.report_pages import ReportPages, ReportPending
from server.container import Runtime
from server.gap_report import GapReporter, RuntimeSources
from server.protocol.admission import InFlight
from storage.schema import SchemaVersionError

logger = logging.getLogger(__name__)

DEFAULT_WINDOW = "7d"
# A page is rendered at most this often per address: a console left reloading, or many people
# looking at once, costs the process serving lookups one render per page and period, not one per
# request (the figures are then at most this old).
PAGE_TTL_S = 2.0
PAGES_KEPT = 64
# One page built at a time (the one worker builds one at a time); a few more wait for it (a
# person with several tabs); beyond that a request is refused at once, with Retry-After.
PAGES_IN_FLIGHT = 1
PAGES_WAITING = 3
RETRY_AFTER_S = 2
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


class ConsoleBusy(Exception):
    """PAGES_IN_FLIGHT pages are being built and PAGES_WAITING more wait: come back later."""


class Console:
    """The console's data: the log at ``log_path``, the live settings and the retrieval stack.

    ``lookups`` are the serving process's lookups in flight, when it serves any: the page process
    is held stopped while they run (``PageProcess.hold``), and a page's handler waits for a pause
    in them before it starts and before it answers (``LookupPause``).
    """

    def __init__(
        self,
        log_path: Path,
        settings: Callable[[], Settings],
        runtime: Callable[[], Awaitable[Runtime]],
        lookups: InFlight | None = None,
    ) -> None:
        self.log_path = log_path
        self._settings = settings
        self._runtime = runtime
        self._lookups = lookups
        self.pages = PageProcess()
        # Used only without the page process (a test's client without a lifespan).
        self._log_pages = LogPages(log_path)
        self._report_pages: ReportPages | None = None
        self._pages: dict[tuple[str, str, bool], tuple[float, str]] = {}
        self._admitted = 0  # page builds in flight or waiting
        self._building = asyncio.Semaphore(PAGES_IN_FLIGHT)
        self.built_here = 0  # pages this process built itself (the tests read it)
        self._pause: LookupPause | None = None  # while running() beside lookups

    async def after_lookups(self) -> None:
        """Wait for a pause in the serving process's lookups (none without them, or a lifespan)."""
        if self._pause is not None:
            await self._pause.wait()

    def cached_page(self, path: str, query: str) -> str | None:
        """A page rendered less than PAGE_TTL_S ago for the same address (and query-text setting)."""
        hit = self._pages.get((path, query, self.show_queries))
        return hit[1] if hit is not None and time.monotonic() - hit[0] < PAGE_TTL_S else None

    def keep_page(self, path: str, query: str, body: str) -> None:
        if len(self._pages) >= PAGES_KEPT:
            self._pages.clear()
        self._pages[(path, query, self.show_queries)] = (time.monotonic(), body)

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """A turn to build a page: waits behind the one in flight, or ConsoleBusy when too many wait."""
        if self._admitted >= PAGES_IN_FLIGHT + PAGES_WAITING:
            raise ConsoleBusy
        self._admitted += 1
        try:
            async with self._building:
                yield
        finally:
            self._admitted -= 1

    @property
    def show_queries(self) -> bool:
        """Query text is shown only while it is logged (``log.log_queries``, hot)."""
        return self._settings().log.log_queries

    async def runtime(self) -> Runtime:
        """The retrieval stack, once warm (the first page may wait for the model to load)."""
        return await self._runtime()

    async def log_page(self, page: str, *args: Any) -> str:
        """The overview or sessions page (``LogPages.page``): by the page process while it runs.

        The process runs between the lifespan's start and stop (``running``); a console without
        one (a test's client that enters no lifespan) builds the page on its own event loop.
        """
        if self.pages.running:
            return await self.pages.build(self.log_path, page, *args)
        self.built_here += 1
        return await self._log_pages.page(page, *args)

    async def report_page(self, page: str, label: str, since: float | None, *args: str) -> str:
        """The gaps, documents or map page (``ReportPages.page``): by the page process while it runs.

        ReportPending while the window's first report is built (it embeds the logged questions).
        """
        runtime = await self.runtime()  # the stack is warm: its catalog exists, its store answers
        shown = self.show_queries
        if self.pages.running:
            spec = ReportSpec(
                self.log_path,
                runtime.catalog.path,
                runtime.settings.embedder,
                runtime.embedder.name,
                runtime.embedder.dim,
            )
            search = RuntimeSources(runtime).search_one
            body = await self.pages.report_page(spec, page, search, label, since, shown, *args)
            if body is None:
                raise ReportPending(label)
            return body
        if self._report_pages is None:
            reporter = GapReporter(RuntimeSources(runtime), self.log_path)
            self._report_pages = ReportPages(
                reporter, lambda: asyncio.to_thread(runtime.engine.knowledge_map)
            )
        self.built_here += 1
        return await self._report_pages.page(page, label, since, shown, *args)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The page process, for the life of the app that serves the console (its lifespan)."""
        self.pages.start()
        unwatch = None
        if self._lookups is not None:
            pause = self._pause = LookupPause()

            def busy() -> None:
                self.pages.hold()
                pause.busy()

            def idle() -> None:
                self.pages.release()
                pause.idle()

            unwatch = self._lookups.watch(busy, idle)
        try:
            yield
        finally:
            if unwatch is not None:
                unwatch()
            self._pause = None
            self.pages.release()
            await self.pages.settle()
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
        await console.after_lookups()
        cached = console.cached_page(path, query)
        if cached is not None:
            return _html(cached)
        try:
            async with console.slot():
                # A request that waited may find the page built meanwhile by the one ahead of it.
                body = console.cached_page(path, query) or await build(console, request, label, since)
            console.keep_page(path, query, body)
        except ConsoleBusy:
            return _busy(label)
        except ReportPending:
            return _html(pages.pending_page(request.url.path, label), 200)
        except Exception as exc:  # the top of a page: every failure is a page that says so
            return _failure(request.url.path, exc, label)
        await console.after_lookups()  # the response's bytes too
        logger.debug("console %s in %.1f ms", request.url.path, (time.perf_counter() - started) * 1000)
        return _html(body)

    return handler


def _busy(label: str) -> HTMLResponse:
    """Too many pages asked for at once: this one is refused now and the browser retries."""
    response = _html(pages.busy_page(label, RETRY_AFTER_S), 503)
    response.headers["retry-after"] = str(RETRY_AFTER_S)
    return response


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
    return await console.report_page("gaps", label, since)


async def _documents(console: Console, request: Request, label: str, since: float | None) -> str:
    sort = request.query_params.get("sort", "delivered")[:40]
    order = "asc" if request.query_params.get("order", "desc") == "asc" else "desc"
    return await console.report_page("documents", label, since, sort, order)


async def _sessions(console: Console, _: Request, label: str, since: float | None) -> str:
    return await console.log_page("sessions", label, since, console.show_queries)


async def _map(console: Console, _: Request, label: str, since: float | None) -> str:
    return await console.report_page("map", label, since)


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
