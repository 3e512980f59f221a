"""Hot reload: the config file is re-read when it changes, checked at most every interval.

An invalid edit keeps the previous settings and logs an error naming the field. Thresholds,
governance, memory TTL, hint language and log settings take effect on the next call; the
Milvus URI, embedder and chunking need a restart (a warning says so).
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

from server.config.settings import ConfigError, Settings, load_settings

logger = logging.getLogger(__name__)

_RESTART_ONLY = ("milvus", "embedder", "chunking", "data_dir", "http", "watch")


class SettingsHolder:
    """Holds the live Settings; ``current()`` is cheap enough to call on every request."""

    def __init__(
        self,
        settings: Settings,
        config_path: Path | None,
        overrides: dict[str, Any],
        *,
        interval_s: float = 0.5,
    ) -> None:
        self._settings = settings
        self._path = config_path
        self._overrides = overrides
        self._interval = interval_s
        self._stamp = self._stat()
        self._checked = time.monotonic()
        self._lock = threading.Lock()
        self.reloads = 0
        self.reload_errors = 0
        self.last_error: str | None = None

    def _stat(self) -> tuple[int, int, int] | None:
        if self._path is None:
            return None
        try:
            st = self._path.stat()
        except OSError:
            return None
        # The inode catches editors that save by renaming a new file over the old one, which
        # can carry an older mtime; nanoseconds catch two quick same-size edits.
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def current(self) -> Settings:
        """The live settings, reloading first if the file changed since the last check."""
        if self._path is not None and time.monotonic() - self._checked >= self._interval:
            self.check()
        return self._settings

    def check(self) -> bool:
        """Reload now if the file changed; returns whether new settings were applied."""
        with self._lock:
            self._checked = time.monotonic()
            stamp = self._stat()
            if stamp is None or stamp == self._stamp:
                return False
            self._stamp = stamp
            try:
                fresh = load_settings(self._path, **self._overrides)
            except ConfigError as exc:
                self.reload_errors += 1
                self.last_error = str(exc)
                logger.error("config reload rejected, keeping the previous settings: %s", exc)
                return False
            for name in _RESTART_ONLY:
                if getattr(fresh, name) != getattr(self._settings, name):
                    logger.warning("config change to %r takes effect after a restart", name)
                    # Keep the running value so the process stays consistent with its resources.
                    fresh = fresh.model_copy(update={name: getattr(self._settings, name)})
            self._settings = fresh
            self.reloads += 1
            self.last_error = None
            logger.info("config reloaded from %s", self._path)
            return True
