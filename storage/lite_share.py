"""One Milvus Lite directory served to every process of the machine that uses it.

Milvus Lite (milvus_lite 3.x) is a pure-Python engine behind a gRPC servicer; its
``MilvusLite(data_dir)`` takes an exclusive ``flock`` on ``<data_dir>/LOCK``, so a second process
that opens the same ``.db`` gets ``DataDirLockedError``. pymilvus hides that behind a generic
"Open local milvus failed".

The design here: the first process to take the lock *owns* the directory and serves it on a unix
socket (private to the user: the socket's directory is mode 0700); every other process, and the
owner itself, talks to it through that socket with an ordinary ``MilvusClient``. The socket path
is derived from the directory's absolute path, so no process has to find it. When the owner
exits, the kernel drops its lock; the next call of a survivor fails, the survivor takes the lock
and serves the socket itself, and the call is retried (upsert, delete by filter, flush and
search are all idempotent). A holder that does not serve the socket (another program, or
an older version of this one) is named by PID in a one-line error; nothing degrades silently.

The socket's path and the lock's holder are storage.lite_socket. This module and
storage.lite_search (which it installs) are the adapters that know milvus_lite's
classes; storage.vector_store only asks this one for a client.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Any

import numpy as np

from storage import lite_search
from storage.lite_socket import (
    LiteShareError,
    ensure_socket_dir,
    lock_holder,
    locked_message,
    socket_answers,
    socket_path,
)

logger = logging.getLogger(__name__)

_MAX_MESSAGE_SIZE = 256 * 1024 * 1024  # what milvus_lite's own server allows
_SERVER_THREADS = 10


def _version() -> str:
    import milvus_lite

    return str(milvus_lite.__version__)


def _servicer(db: Any) -> Any:
    """milvus_lite's servicer over ``db``, answering AllocTimestamp "unimplemented" without a traceback.

    pymilvus asks for a timestamp after every create_index, only to poll the index state, and
    goes on when the server does not implement it (Milvus Lite builds the index at once). The
    generated base method sets the same UNIMPLEMENTED status but then raises, and gRPC logs
    that as an ERROR traceback on every new collection. The client sees the same status here.
    """
    import grpc
    from milvus_lite.adapter.grpc.servicer import MilvusServicer
    from pymilvus.grpc_gen import milvus_pb2

    def alloc_timestamp(request: Any, context: Any) -> Any:
        context.set_code(grpc.StatusCode.UNIMPLEMENTED)
        context.set_details("Method not implemented!")
        return milvus_pb2.AllocTimestampResponse()

    servicer = MilvusServicer(db)
    # Registration reads the handlers off the instance, so the instance's own one is served.
    servicer.AllocTimestamp = alloc_timestamp
    return servicer


class _Share:
    """This process's handle on one Lite directory: owned and served here, or reached over the socket."""

    def __init__(self, db_path: Path) -> None:
        self.db_path = db_path
        self.socket = socket_path(db_path)
        self.refs = 0
        self.lock = threading.RLock()
        self._db: Any = None
        self._server: Any = None

    @property
    def uri(self) -> str:
        return f"unix:{self.socket}"

    @property
    def owned(self) -> bool:
        return self._server is not None

    def ensure(self, timeout_s: float) -> None:
        """Make the socket answer: serve it from here when the directory is free, else wait for its owner."""
        deadline = time.monotonic() + timeout_s
        # Before connecting as well as before serving: a socket in a directory someone else
        # controls may be theirs.
        ensure_socket_dir(self.socket.parent)
        with self.lock:
            while True:
                if self._server is not None or self._try_own():
                    return
                if socket_answers(self.socket):
                    return
                if time.monotonic() >= deadline:
                    raise LiteShareError(locked_message(self.db_path, timeout_s))
                # The owner took the lock but is still binding the socket, or is exiting.
                time.sleep(0.1)

    def _try_own(self) -> bool:
        import grpc
        from milvus_lite import DataDirLockedError
        from milvus_lite.db import MilvusLite
        from pymilvus.grpc_gen import milvus_pb2_grpc

        self.db_path.parent.mkdir(parents=True, exist_ok=True)
        if not lite_search.install():
            logger.info(
                "milvus_lite %s: its own search (the visible-rows cache is checked on 3.2)", _version()
            )
        try:
            db = MilvusLite(str(self.db_path))
        except DataDirLockedError:
            return False
        except OSError as exc:
            raise LiteShareError(f"cannot open the Milvus Lite data at {str(self.db_path)!r}: {exc}") from exc
        try:
            # Loaded is a state of the serving process: a new owner must load what the old one had
            # loaded, or every search of the survivors fails with "call load() before search".
            for name in db.list_collections():
                db.get_collection(name).load()
            # We hold the lock, so a socket file left here belongs to an owner that is gone.
            with contextlib.suppress(FileNotFoundError):
                self.socket.unlink()
            server = grpc.server(
                futures.ThreadPoolExecutor(max_workers=_SERVER_THREADS, thread_name_prefix="lite-share"),
                options=[
                    ("grpc.max_receive_message_length", _MAX_MESSAGE_SIZE),
                    ("grpc.max_send_message_length", _MAX_MESSAGE_SIZE),
                    # pymilvus pings every 10 s even when idle; gRPC's default server policy answers
                    # that with GOAWAY "too_many_pings" and drops the connection of an idle server.
                    ("grpc.keepalive_permit_without_calls", 1),
                    ("grpc.http2.min_recv_ping_interval_without_data_ms", 5000),
                    ("grpc.http2.max_ping_strikes", 0),
                ],
            )
            milvus_pb2_grpc.add_MilvusServiceServicer_to_server(_servicer(db), server)
            server.add_insecure_port(self.uri)
            server.start()
        except BaseException:
            db.close()
            raise
        self._db, self._server = db, server
        logger.info("serving Milvus Lite %s to other processes on %s", self.db_path, self.socket)
        return True

    def local_search(
        self,
        collection_name: str,
        *,
        data: list[list[float]],
        limit: int = 10,
        filter: str = "",
        output_fields: list[str] | None = None,
        search_params: dict[str, Any] | None = None,
        **other: Any,
    ) -> list[list[dict[str, Any]]] | None:
        """A dense search on the engine served here, without the socket; None when it must go over it.

        The same ``Collection.search`` the socket's servicer calls, with the same arguments; the
        socket's round trip cost about 2.5 ms of CPU per search at 10k chunks, more than the
        search. Scores are rounded to float32, as the wire carries them, so both ways give the
        same hits with the same scores (tests/test_lite_search.py).
        """
        with self.lock:
            db = self._db
        if db is None or other:
            return None  # not served here, or an option only the socket's servicer translates
        params = dict(search_params or {})
        hits: list[list[dict[str, Any]]] = db.get_collection(collection_name).search(
            data,
            top_k=limit,
            metric_type=params.get("metric_type"),
            expr=filter or None,
            output_fields=output_fields,
            search_params=params.get("params"),
        )
        for query_hits in hits:
            for hit in query_hits:
                hit["distance"] = float(np.float32(hit["distance"]))
        return hits

    def disown(self) -> None:
        """Stop serving and release the lock, so that a survivor can take over."""
        with self.lock:
            if self._server is None:
                return
            self._server.stop(grace=1.0).wait()
            # Only while the lock is ours: once it is released a survivor may bind this same path,
            # and removing the file then would leave it serving a socket nobody can reach.
            # (gRPC removes the file on stop already; this covers a stop that did not.)
            with contextlib.suppress(FileNotFoundError):
                self.socket.unlink()
            self._db.close()
            self._db, self._server = None, None


def lost_connection(failure: BaseException) -> bool:
    """A failure of the channel (its server stopped or is not there yet), not of the call made on it."""
    import grpc
    from pymilvus.client.types import Status
    from pymilvus.exceptions import MilvusException

    unavailable = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
    for error in (failure, failure.__cause__):
        if isinstance(error, MilvusException) and error.code in (Status.CONNECT_FAILED, *unavailable):
            return True
        if isinstance(error, grpc.RpcError) and error.code() in unavailable:
            return True
    return False


_shares: dict[Path, _Share] = {}
_shares_lock = threading.Lock()


class SharedLiteClient:
    """A ``MilvusClient`` on the shared socket that survives its owner: it reconnects to the next
    owner (or becomes it) and retries, within the timeout.

    Only the client methods are proxied; a failure over a channel that works is the caller's
    error (a bad filter, a missing collection) and is raised unchanged.
    """

    def __init__(self, share: _Share, timeout_s: float) -> None:
        self._share = share
        self._timeout = timeout_s
        self._swap = threading.Lock()
        self._client = self._new_client()

    def _new_client(self) -> Any:
        from pymilvus import MilvusClient

        # dedicated: pymilvus otherwise shares one connection per URI in the process, and a closed
        # client's broken channel would be handed to the client that replaces it.
        return MilvusClient(uri=self._share.uri, timeout=self._timeout, dedicated=True)

    def search(self, collection_name: str, **kwargs: Any) -> Any:
        """In the process that serves the directory, straight to the engine; elsewhere over the socket."""
        local = self._share.local_search(collection_name, **kwargs) if self._share.owned else None
        if local is not None:
            return local
        return self.__getattr__("search")(collection_name, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if not callable(getattr(self._client, name)):
            return getattr(self._client, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            deadline = time.monotonic() + self._timeout
            client = self._client
            while True:
                try:
                    return getattr(client, name)(*args, **kwargs)
                except Exception as exc:
                    if time.monotonic() >= deadline:
                        raise
                    if client is not self._client:
                        # Another thread recovered meanwhile and closed this client (pymilvus then
                        # says "should create connection first"): retry on its replacement.
                        client = self._client
                        continue
                    if not self._owner_went_away(exc):
                        raise
                client = self._recover(client, deadline)

        return call

    def _owner_went_away(self, failure: Exception) -> bool:
        """Whether a failed call is the serving process going away, not the caller's error.

        The socket may answer again by the time the failure is seen: another survivor took over.
        So a lost channel counts even then; only a failure over a channel that works (a bad filter,
        a missing collection) is the caller's.
        """
        if self._share.owned:
            return False
        return lost_connection(failure) or not socket_answers(self._share.socket)

    def _recover(self, failed: Any, deadline: float) -> Any:
        """The client to retry with: on the socket's next owner (this process, if the lock is free)."""
        logger.warning(
            "the owner of Milvus Lite %s went away; taking over or reconnecting", self._share.db_path
        )
        while True:
            self._share.ensure(max(0.1, deadline - time.monotonic()))
            try:
                return self._replace(failed)
            except Exception as exc:
                # The next owner holds the lock but does not answer yet (this process too, the
                # moment it took over): wait for it.
                if not lost_connection(exc) or time.monotonic() >= deadline:
                    raise
                time.sleep(0.1)

    def _replace(self, failed: Any) -> Any:
        """The current client, once ``failed`` is replaced by a new one (unless another thread did it).

        The new client is made before the failed one is closed, so the current client is never a
        closed one: a thread whose call failed on a closed client finds it replaced and retries
        (``call``), rather than take pymilvus's "should create connection first" for its error.
        """
        with self._swap:
            if self._client is failed:  # another thread may have recovered already
                self._client = self._new_client()
                with contextlib.suppress(Exception):
                    failed.close()
            return self._client

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._client.close()
        release(self._share)


def connect(db_uri: str, timeout_s: float) -> SharedLiteClient:
    """A client on the Lite directory db_uri, shared with every other process that opens it."""
    db_path = Path(db_uri).resolve()
    with _shares_lock:
        share = _shares.setdefault(db_path, _Share(db_path))
        share.refs += 1
    try:
        share.ensure(timeout_s)
        return SharedLiteClient(share, timeout_s)
    except BaseException:
        release(share)
        raise


def release(share: _Share) -> None:
    """Drop one reference; the last one in this process stops serving (a survivor takes over)."""
    with _shares_lock:
        share.refs -= 1
        if share.refs > 0:
            return
        _shares.pop(share.db_path, None)
    share.disown()


def probe(db_uri: str, timeout_s: float) -> str | None:
    """Why this process could not use the Lite directory (None when it is free or shared)."""
    db_path = Path(db_uri).resolve()
    deadline = time.monotonic() + timeout_s
    sock = socket_path(db_path)
    try:
        ensure_socket_dir(sock.parent)
    except LiteShareError as exc:
        return str(exc)
    while True:
        if lock_holder(db_path) is None or socket_answers(sock):
            return None
        if time.monotonic() >= deadline:
            return locked_message(db_path, timeout_s)
        time.sleep(0.1)
