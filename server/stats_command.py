"""``stats`` and the knowledge://stats resource. Placeholder until the observability issue lands."""

from __future__ import annotations

import argparse
from typing import Any

from server.settings import Settings


async def stats_summary(resources: Any) -> dict[str, Any]:
    return {}


def run_stats(args: argparse.Namespace, settings: Settings) -> int:
    print("{}")
    return 0
