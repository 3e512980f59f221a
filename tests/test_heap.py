"""The collector's settings while a server serves: the view frozen once per view, freed when replaced."""

from __future__ import annotations

import asyncio
import gc
import shutil
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from server.heap import YOUNG_THRESHOLD
from server.protocol.app import create_server
from server.watch import watch_ingest
from tests.conftest import SAMPLE_KB
from tests.helpers import lookup

NEW_DOC = "infrastructure/zebra-cache.md"
NEW_TEXT = (
    "---\ntitle: Zebra cache eviction\nkeywords: [ZEBRA_EVICT_42]\n---\n# Zebra cache\n\n"
    "ZEBRA_EVICT_42 is the error the zebra cache raises when it evicts a pinned entry.\n"
)


async def test_a_serving_view_is_frozen_once_and_freed_once_an_ingest_replaces_it(
    make_resources: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    freezes: list[int] = []
    freeze = gc.freeze
    monkeypatch.setattr(gc, "freeze", lambda: (freezes.append(1), freeze())[1])
    before = gc.get_threshold()
    resources = make_resources()
    with anyio.fail_after(120):
        async with Client(create_server(resources)) as client:
            assert (await lookup(client, "ERR_TIMEOUT", "s1"))["primary"] is not None
            assert gc.get_threshold()[0] == max(YOUNG_THRESHOLD, before[0])
            frozen = gc.get_freeze_count()
            assert frozen > 10_000  # the view, the model's wrapper, the SDK: all left out from now on

            assert len(freezes) == 1
            # A second lookup on the same view freezes nothing more (a frozen object that
            # reference counting frees meanwhile lowers the count: that is no freeze).
            await lookup(client, "rate limit", "s2")
            assert len(freezes) == 1 and gc.get_freeze_count() <= frozen

            engine = resources.service.engine
            old = weakref.ref(engine.view())
            kb = tmp_path / "kb"
            shutil.copytree(SAMPLE_KB, kb)
            (kb / NEW_DOC).write_text(NEW_TEXT, encoding="utf-8")
            await asyncio.to_thread(watch_ingest(resources.runtime, kb))

            assert (await lookup(client, "ZEBRA_EVICT_42", "s3"))["primary"]["doc_key"] == NEW_DOC
            # The replaced view was frozen, so no collection could free it: only reference
            # counting did, which it can only when nothing holds it and it holds no cycle.
            assert old() is None
            assert len(freezes) == 2 and gc.get_freeze_count() > 0
    # The last server of the process gave the collector back as it found it.
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == before
