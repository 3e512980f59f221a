"""The one error a CLI command raises: the command cannot run, and the message says why."""

from __future__ import annotations


class CommandError(RuntimeError):
    """A command cannot run; the message says why (printed as ``error: ...``, exit code 2)."""
