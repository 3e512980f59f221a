"""The conversion child: ``python -m storage.convert._child MEMORY_MB``; see storage.convert.worker."""

from __future__ import annotations

import json
import logging
import resource
import sys
import warnings
from collections.abc import Callable

from storage.convert import convert_bytes
from storage.convert._types import ConversionError, Converted
from storage.convert.worker import read_frame, write_frame

Convert = Callable[[bytes, str], Converted]


def _warm() -> None:
    """Import every converter before the memory cap, so the cap bounds the conversion alone."""
    import storage.convert._html
    import storage.convert._office
    import storage.convert._pdf  # noqa: F401


def _reply(convert: Convert, suffix: str, raw: bytes, memory_mb: int) -> dict[str, object]:
    try:
        converted = convert(raw, suffix)
    except ConversionError as exc:
        return {"error": str(exc)}
    except MemoryError:
        return {"error": f"conversion needed more than {memory_mb} MB (conversion.memory_mb)", "fatal": True}
    except RecursionError:
        return {"error": "the file nests too deeply to convert"}
    except Exception as exc:  # the child's top level: any converter bug becomes this file's failure
        return {"error": f"the converter failed ({type(exc).__name__}: {exc})"}
    return {"markdown": converted.markdown, "title": converted.title, "domain": converted.domain}


def serve(memory_mb: int, convert: Convert) -> None:
    """Cap the address space, then answer requests on stdin until it closes."""
    logging.disable(logging.CRITICAL)  # converters warn about every odd PDF; failures come as replies
    warnings.simplefilter("ignore")
    limit = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while (header := read_frame(stdin)) is not None and (raw := read_frame(stdin)) is not None:
        reply = _reply(convert, json.loads(header)["suffix"], raw, memory_mb)
        write_frame(stdout, json.dumps(reply).encode())
        stdout.flush()
        if reply.get("fatal"):
            return


if __name__ == "__main__":
    _warm()
    serve(int(sys.argv[1]), convert_bytes)
