"""``console``: the read-only web console alone, on loopback unless told otherwise.

It reads the invocation log beside a running server (or none) and opens the retrieval stack
in the background for the pages that need it (gaps, documents, the map).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from typing import Any

import anyio

from server.cli.errors import CommandError
from server.cli.listen import BindError, address_text, bind_listeners
from server.config.settings import Settings
from server.console.app import Console, ConsoleUnavailable, console_app
from server.container import Runtime, open_runtime
from server.transport.http_security import BearerAuthMiddleware, HostOriginGuard, host_policy, warn_if_exposed

logger = logging.getLogger(__name__)


class _LazyRuntime:
    """The stack, opened on a thread on first use and shared by every page after."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._task: asyncio.Task[Runtime] | None = None
        self.opened: Runtime | None = None

    async def __call__(self) -> Runtime:
        if self._task is None:
            self._task = asyncio.create_task(asyncio.to_thread(open_runtime, self._settings))
        try:
            self.opened = await asyncio.shield(self._task)
        except Exception as exc:  # the model or Milvus failed: every page that needs them says so
            logger.exception("cannot open the knowledge base")
            raise ConsoleUnavailable(f"the knowledge base is unavailable: {exc}") from exc
        return self.opened


def guarded_console(settings: Settings, runtime: Any) -> Any:
    """The console app behind the Host/Origin guard and, when tokens are configured, bearer auth."""
    http = settings.http
    app: Any = HostOriginGuard(
        console_app(Console(settings.log_path, lambda: settings, runtime)),
        host_policy(http.host, http.allowed_hosts),
    )
    principals = http.principals()
    return BearerAuthMiddleware(app, principals) if principals else app


def cmd_console(args: argparse.Namespace, settings: Settings, *_: Any) -> int:
    """Serve ``/console`` until interrupted."""
    import uvicorn

    http = settings.http
    try:
        listeners = bind_listeners(http.host, http.port)
    except BindError as exc:
        raise CommandError(str(exc)) from exc
    warning = warn_if_exposed(http.host, bool(http.principals()))
    if warning:
        print(warning, file=sys.stderr)
    runtime = _LazyRuntime(settings)
    port = listeners[0].getsockname()[1]
    logger.info("console on http://%s/console", address_text(http.host, port))
    config = uvicorn.Config(
        guarded_console(settings, runtime), host=http.host, port=port, log_level="warning", lifespan="on"
    )
    try:
        anyio.run(uvicorn.Server(config).serve, listeners)
    finally:
        for sock in listeners:
            sock.close()
        if runtime.opened is not None:
            runtime.opened.close()
    return 0
