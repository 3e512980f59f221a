"""A conversion child whose converter misbehaves on purpose: on a file whose bytes are ``hang``,
``crash`` or ``oom`` it hangs, crashes or runs out of memory.

Run by storage.convert.worker.ConversionWorker(module="tests.converter_faults") in tests/test_formats.py;
any other file converts as in the real child.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from storage.convert import Converted, convert_bytes
from storage.convert._child import serve


def misbehave(raw: bytes, suffix: str) -> Converted:
    if raw == b"hang":
        time.sleep(3600)
    if raw == b"crash":
        os.kill(os.getpid(), signal.SIGSEGV)
    if raw == b"oom":
        hog = bytearray(4 * 1024 * 1024 * 1024)  # more than any memory limit the tests set
        return Converted(str(len(hog)))
    return convert_bytes(raw, suffix)


if __name__ == "__main__":
    serve(int(sys.argv[1]), misbehave)
