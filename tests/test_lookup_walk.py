"""One lookup walks handler -> service -> grade -> plan -> account -> render, once, in that order.

A real in-process MCP client calls ``lookup_knowledge`` on a server over Milvus Lite and the
sample knowledge base. While the tool handler runs, a profile function (``sys.setprofile`` on the
event loop's thread, ``threading.setprofile`` for the worker threads of ``asyncio.to_thread``)
notes the product file (under ``server/``, ``retrieval/`` or ``storage/``) of every function
entered, in order. What counts as entering a function:

- a call of a function, method, property or lambda, on the handler's own task (not the client's
  or the SDK's other tasks) or on a worker thread while the handler runs;
- not a coroutine or generator resuming after an ``await`` or ``yield``: it was entered once;
- not a list, set or dict comprehension: it is part of the function it is written in (Python
  3.12 runs it inline, without a frame of its own).

The walk's sequence is those files with consecutive repeats collapsed. The main steps are the
handler (``server/protocol/tools.py`` and ``handlers.py``) and the five lookup modules; every
other file (storage reads, text utilities, action memory, the settings and the log) is a leaf,
entered from a step and left again. Back-and-forth is a main step entered again after a later
step was entered: with the leaves left out and consecutive repeats collapsed, the main steps
must read exactly handler, service, grade, plan, account, render, each once.
"""

from __future__ import annotations

import asyncio
import dis
import sys
import threading
import types
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from mcp import Client

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("server", "retrieval", "storage")
HANDLER = ("server/protocol/tools.py", "lookup_knowledge")
_RETURNS = {dis.opmap[name] for name in ("RETURN_VALUE", "RETURN_CONST") if name in dis.opmap}
_INLINE = {"<listcomp>", "<setcomp>", "<dictcomp>"}
HANDLER_FILES = ("server/protocol/tools.py", "server/protocol/handlers.py")
STEPS = {
    "handler": HANDLER_FILES,
    "service": ("retrieval/service.py",),
    "grade": ("retrieval/grade.py",),
    "plan": ("retrieval/plan.py",),
    "account": ("retrieval/account.py",),
    "render": ("retrieval/render.py",),
}
STEP_OF = {name: step for step, names in STEPS.items() for name in names}


def _product_file(code: types.CodeType) -> str | None:
    """The file's path from the repository root, when it is a product module."""
    path = Path(code.co_filename)
    if not path.is_absolute() or ROOT not in path.parents:
        return None
    relative = path.relative_to(ROOT).as_posix()
    return relative if relative.split("/")[0] in LAYERS else None


@dataclass
class Walk:
    """The product files entered while the tool handler ran, in order (threads interleaved by time)."""

    entries: list[str] = field(default_factory=list)
    on_workers: set[str] = field(default_factory=set)  # the files entered on worker threads
    _recording: bool = False
    _task: asyncio.Task[Any] | None = None
    _handler: types.FrameType | None = None
    _seen: set[types.FrameType] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def main_thread(self, frame: types.FrameType, event: str, arg: Any) -> None:
        if (
            event == "call"
            and not self._recording
            and ((_product_file(frame.f_code), frame.f_code.co_name) == HANDLER)
        ):
            self._recording, self._task, self._handler = True, asyncio.current_task(), frame
        if not self._recording or asyncio.current_task() is not self._task:
            return
        if event == "return" and frame is self._handler and frame.f_code.co_code[frame.f_lasti] in _RETURNS:
            self._recording = False  # the handler returned (a suspension at an await is not a return)
            return
        self._note(frame, event, worker=False)

    def worker_thread(self, frame: types.FrameType, event: str, arg: Any) -> None:
        if self._recording:
            self._note(frame, event, worker=True)

    def _note(self, frame: types.FrameType, event: str, *, worker: bool) -> None:
        if event != "call" or frame.f_code.co_name in _INLINE:
            return
        name = _product_file(frame.f_code)
        with self._lock:
            if frame in self._seen:
                return  # a coroutine or generator resuming
            self._seen.add(frame)
            if name is not None:
                self.entries.append(name)
                if worker:
                    self.on_workers.add(name)

    def restart(self) -> None:
        """Forget what was entered so far: the next handler call starts the walk."""
        with self._lock:
            self.entries.clear()
            self.on_workers.clear()
            self._seen.clear()

    @property
    def files(self) -> list[str]:
        """The distinct product files entered, in the order first entered."""
        return list(dict.fromkeys(self.entries))

    @property
    def sequence(self) -> list[str]:
        """The entries with consecutive repeats collapsed."""
        return _collapsed(self.entries)

    @property
    def steps(self) -> list[str]:
        """The main steps entered, leaves left out, consecutive repeats collapsed."""
        return _collapsed([STEP_OF[name] for name in self.entries if name in STEP_OF])


def _collapsed(items: list[str]) -> list[str]:
    return [item for i, item in enumerate(items) if i == 0 or items[i - 1] != item]


@contextmanager
def recording(walk: Walk) -> Iterator[None]:
    threading.setprofile(walk.worker_thread)
    sys.setprofile(walk.main_thread)
    try:
        yield
    finally:
        sys.setprofile(None)
        threading.setprofile(None)


async def _walk_of_one_lookup(make_server: Any, query: str, **arguments: Any) -> Walk:
    """The walk of one governed lookup, the second of its session, on a server already serving."""
    # Fresh worker threads for asyncio.to_thread, started after threading.setprofile installs the hook.
    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(thread_name_prefix="walk"))
    walk = Walk()
    with recording(walk):
        async with Client(make_server(), mode="legacy") as client:
            with anyio.fail_after(120):
                # Loads the view and the model's first batch: the walk is of a lookup that serves.
                warm = await client.call_tool("lookup_knowledge", {"query": "报销流程"})
                assert not warm.is_error, warm.content
                walk.restart()
                result = await client.call_tool("lookup_knowledge", {"query": query, **arguments})
    assert not result.is_error, result.content
    return walk


def _describe(walk: Walk) -> str:
    files = walk.files
    workers = sorted(walk.on_workers)
    return (
        f"steps {walk.steps}; {len(files)} product files: {files}; on worker threads {workers}; "
        f"sequence {walk.sequence}"
    )


async def test_a_lookup_enters_each_step_once_in_order(make_server: Any) -> None:
    walk = await _walk_of_one_lookup(make_server, "ERR_TIMEOUT 是什么")
    assert walk.steps == list(STEPS), _describe(walk)
    # The retrieval ran on a worker thread (asyncio.to_thread), and was recorded there.
    assert "retrieval/engine.py" in walk.on_workers, _describe(walk)


async def test_a_targeted_lookup_makes_its_two_searches_before_grading(make_server: Any) -> None:
    """Both searches (the dimension, and the topic) run before the grade step, which grades both."""
    walk = await _walk_of_one_lookup(
        make_server, "ERR_TIMEOUT 是什么", missing_dimension="how to raise the timeout"
    )
    assert walk.steps == list(STEPS), _describe(walk)


def test_the_order_check_sees_back_and_forth() -> None:
    """Guards the assertion above against an empty or misread walk."""
    walk = Walk(entries=[*HANDLER_FILES, "retrieval/service.py", "retrieval/grade.py"])
    walk.entries += ["storage/text.py", "retrieval/service.py", "retrieval/plan.py"]
    assert walk.steps == ["handler", "service", "grade", "service", "plan"]
    leaves = Walk(
        entries=["retrieval/grade.py", "retrieval/ranking.py", "storage/text.py", "retrieval/grade.py"]
    )
    assert leaves.steps == ["grade"] and leaves.sequence == [*leaves.files, "retrieval/grade.py"]
