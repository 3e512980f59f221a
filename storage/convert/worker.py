"""Conversion in a child process, bounded per file in time and memory.

A converter is third-party code fed untrusted files: a crafted PDF can loop, a zip bomb can fill
the memory, a bug in a C extension can crash. So an ingest converts in one long-lived child
(started at the first file that needs it, so a markdown-only ingest never pays for it) whose
address space is capped with RLIMIT_AS. A file that takes longer than the time limit has its
child killed; a child that dies is reported as that file's failure; either way the next file
gets a fresh child and the ingest goes on.

Frames on the pipes: a 4-byte big-endian length, then the bytes. A request is two frames (a
JSON header, the file's bytes); a reply is one JSON frame, ``{"markdown", "title", "domain"}``
or ``{"error"}``.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from storage.convert._types import ConversionError, Converted

logger = logging.getLogger(__name__)

_LENGTH = struct.Struct(">I")
_PROJECT_ROOT = str(Path(__file__).resolve().parents[2])


@dataclass(frozen=True)
class ConversionLimits:
    """Per-file bounds on conversion (the ``conversion`` settings)."""

    timeout_s: float = 60.0
    memory_mb: int = 1024
    max_file_mb: float = 25.0


def write_frame(stream: IO[bytes], payload: bytes) -> None:
    stream.write(_LENGTH.pack(len(payload)) + payload)


def read_frame(stream: IO[bytes]) -> bytes | None:
    """One frame, or None at the end of the stream."""
    header = stream.read(_LENGTH.size)
    if len(header) < _LENGTH.size:
        return None
    (size,) = _LENGTH.unpack(header)
    payload = stream.read(size)
    return payload if len(payload) == size else None


class ConversionWorker:
    """Converts files in a bounded child process; ``convert`` raises ConversionError per file."""

    def __init__(self, limits: ConversionLimits, *, module: str = "storage.convert._child") -> None:
        self.limits = limits
        self._module = module  # the child's entry point; tests give one that hangs or crashes
        self._child: subprocess.Popen[bytes] | None = None

    def convert(self, raw: bytes, suffix: str) -> Converted:
        """The converted file; ConversionError when it is too large, fails, hangs or kills its child."""
        size_mb = len(raw) / (1024 * 1024)
        if size_mb > self.limits.max_file_mb:
            raise ConversionError(
                f"file is {size_mb:.1f} MB, over the {self.limits.max_file_mb:g} MB limit "
                "(conversion.max_file_mb)"
            )
        stdin, stdout = self._pipes()
        try:
            write_frame(stdin, json.dumps({"suffix": suffix}).encode())
            write_frame(stdin, raw)
            stdin.flush()
        except BrokenPipeError:
            raise self._lost() from None
        reply = self._reply(stdout)
        if "error" in reply:
            raise ConversionError(str(reply["error"]))
        return Converted(str(reply["markdown"]), title=str(reply["title"]), domain=str(reply["domain"]))

    def close(self) -> None:
        """Stop the child, if one runs."""
        child, self._child = self._child, None
        if child is None:
            return
        if child.poll() is None:
            child.kill()
        child.wait()
        for stream in (child.stdin, child.stdout):
            if stream is not None:
                stream.close()

    def _pipes(self) -> tuple[IO[bytes], IO[bytes]]:
        if self._child is None or self._child.poll() is not None:
            self.close()
            env = {
                **os.environ,
                "PYTHONPATH": os.pathsep.join(filter(None, [_PROJECT_ROOT, os.environ.get("PYTHONPATH")])),
            }
            self._child = subprocess.Popen(
                [sys.executable, "-m", self._module, str(self.limits.memory_mb)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                # stderr is the parent's: the child silences the converters' warnings, so what shows
                # there is the child failing to start, which no reply could report.
                env=env,
            )
        child = self._child
        if child.stdin is None or child.stdout is None:
            raise RuntimeError("the conversion child has no pipes")
        return child.stdin, child.stdout

    def _reply(self, stdout: IO[bytes]) -> dict[str, Any]:
        """The child's reply within the time limit; the child is killed when it is late or dies."""
        deadline = time.monotonic() + self.limits.timeout_s
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([stdout], [], [], max(left, 0))
            if ready:
                break
            if left <= 0:
                self.close()
                raise ConversionError(
                    f"conversion took longer than {self.limits.timeout_s:g} s (conversion.timeout_s); stopped"
                )
        frame = read_frame(stdout)
        if frame is None:
            raise self._lost()
        reply: dict[str, Any] = json.loads(frame)
        if reply.get("fatal"):  # the child ran out of memory: its state is not to be trusted
            self.close()
        return reply

    def _lost(self) -> ConversionError:
        """The error for a child that died on this file (restarted for the next one)."""
        child = self._child
        code = child.wait() if child is not None else None
        self.close()
        if code is not None and code < 0:
            name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
            return ConversionError(f"the converter crashed ({name}); memory limit {self.limits.memory_mb} MB")
        return ConversionError(f"the converter exited (code {code}) during conversion")
