"""The console's report pages (gaps, documents, the knowledge map), over one gap reporter.

The same work runs in the console's page process (``server.console._worker``) or, for a console
without one (a test's client that enters no lifespan), on the serving process's event loop.
The pages change only when their report is rebuilt (at most once a minute): every other request
of such a page costs a dictionary lookup, not a render.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from retrieval.models import KnowledgeMap
from server.console import pages
from server.gap_report import GapReport, GapReporter

RENDERS_KEPT = 64
REPORT_PAGES = ("gaps", "documents", "map")


class ReportPending(Exception):
    """The window's first gap report is being built; the page asks the browser to come back."""


class ReportPages:
    """Renders the report pages of ``reporter``'s log; ``knowledge_map`` reads the catalog's map."""

    def __init__(self, reporter: GapReporter, knowledge_map: Callable[[], Awaitable[KnowledgeMap]]) -> None:
        self.reporter = reporter
        self._knowledge_map = knowledge_map
        self._renders: dict[tuple[str, ...], tuple[GapReport, object, str]] = {}

    async def page(self, name: str, label: str, since: float | None, show_queries: bool, *args: str) -> str:
        """The page ``name`` (one of REPORT_PAGES) of the window ``label``; ReportPending while it is built."""
        report = await self.reporter.latest(since, log_queries=show_queries, window=label)
        if report is None:
            raise ReportPending(label)
        if name == "gaps":
            return self.gaps(report, label, show_queries)
        if name == "documents":
            sort, order = args
            return self.documents(report, label, sort, order != "asc")
        if name == "map":
            return self.map(report, label, await self._knowledge_map())
        raise ValueError(f"no report page {name!r}")

    def gaps(self, report: GapReport, label: str, shown: bool) -> str:
        # Without logged query text the groups (which quote questions) are never rendered.
        def render() -> str:
            return pages.gaps_page(report if shown else report.model_copy(update={"groups": []}), label)

        return self.rendered(("gaps", label, str(shown)), report, None, render)

    def documents(self, report: GapReport, label: str, sort: str, descending: bool) -> str:
        return self.rendered(
            ("documents", label, sort, str(descending)),
            report,
            None,
            lambda: pages.documents_page(report, label, sort, descending),
        )

    def map(self, report: GapReport, label: str, knowledge_map: KnowledgeMap) -> str:
        delivered: dict[str, int] = {}
        for doc in report.documents.all:
            delivered[doc.domain or ""] = delivered.get(doc.domain or "", 0) + doc.delivered
        return self.rendered(
            ("map", label), report, knowledge_map, lambda: pages.map_page(knowledge_map, delivered, label)
        )

    def rendered(
        self, key: tuple[str, ...], report: GapReport, extra: object, render: Callable[[], str]
    ) -> str:
        """A report page, rendered once per report (and ``extra``, compared by value) and variant ``key``."""
        hit = self._renders.get(key)
        if hit is not None and hit[0] is report and hit[1] == extra:
            return hit[2]
        body = render()
        if len(self._renders) >= RENDERS_KEPT:
            self._renders.clear()
        self._renders[key] = (report, extra, body)
        return body
