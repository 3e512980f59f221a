"""Hot reload: the config file is re-read when it changes, checked at most every interval.

An invalid edit keeps the previous settings and logs an error naming the field. Which edits
apply to the next call and which wait for a restart is declared on the settings model
(``server.config.settings.reload_rules``); a restart-only setting keeps its running value and a
warning names it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from functools import reduce
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from server.config.errors import ConfigError
from server.config.loading import load_settings
from server.config.settings import Settings, restart_only_paths

logger = logging.getLogger(__name__)

_Model = TypeVar("_Model", bound=BaseModel)


def _replaced(model: _Model, path: Sequence[str], value: object) -> _Model:
    """A copy of model with the setting at path (names from the top) set to value."""
    head, *rest = path
    inner = _replaced(getattr(model, head), rest, value) if rest else value
    return model.model_copy(update={head: inner})


def keep_restart_only(fresh: Settings, running: Settings) -> Settings:
    """fresh, with every restart-only setting back at its running value (a warning per change)."""
    for dotted in restart_only_paths():
        path = dotted.split(".")
        value = reduce(getattr, path, running)
        if reduce(getattr, path, fresh) != value:
            logger.warning("config change to %r takes effect after a restart", dotted)
            # The process stays consistent with the resources it opened from the running value.
            fresh = _replaced(fresh, path, value)
    return fresh


def _consistent(settings: Settings) -> Settings:
    """settings, checked again once restart-only values are back: an edit that is valid on its own
    (a new embedder with only its own relevance model) can leave the running embedder uncovered."""
    try:
        return Settings.model_validate(settings.model_dump())
    except ValidationError as exc:
        raise ConfigError(f"with the restart-only settings kept at their running values: {exc}") from exc


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
                fresh = _consistent(
                    keep_restart_only(load_settings(self._path, **self._overrides), self._settings)
                )
            except ConfigError as exc:
                self.reload_errors += 1
                self.last_error = str(exc)
                logger.error("config reload rejected, keeping the previous settings: %s", exc)
                return False
            self._settings = fresh
            self.reloads += 1
            self.last_error = None
            logger.info("config reloaded from %s", self._path)
            return True
