"""Where the owner of a Milvus Lite directory serves it, and who holds its lock (storage.lite_share).

The socket sits in a per-user directory of the shared temporary directory, under a name derived
from the Lite directory's absolute path, so every process finds it without being told; the lock
is milvus_lite's ``flock`` on ``<data_dir>/LOCK``, whose holder /proc/locks names.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import socket
import stat
import tempfile
from pathlib import Path

LOCK_FILENAME = "LOCK"  # milvus_lite.constants.LOCK_FILENAME


class LiteShareError(RuntimeError):
    """The Lite directory is held by a process that does not share it, or cannot be opened."""


def socket_path(db_path: Path) -> Path:
    """Where the owner of db_path serves it: short (unix sockets allow ~107 bytes) and per user."""
    digest = hashlib.sha1(str(db_path.resolve()).encode()).hexdigest()[:20]
    return Path(tempfile.gettempdir()) / f"lookup-knowledge-{os.getuid()}" / f"{digest}.sock"


def ensure_socket_dir(directory: Path) -> None:
    """Create the socket directory (0700) or prove the one there is ours; raises LiteShareError.

    It sits in the shared temporary directory under a name anyone can predict, so another user
    may have created it first (or put a symlink there) to serve their own socket in our place.
    It is opened without following a link and checked on the open descriptor: a directory owned
    by this user; a looser mode of our own directory is tightened to 0700.
    """
    with contextlib.suppress(FileExistsError):
        directory.mkdir(mode=0o700)
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        why = (
            "it is a symlink or not a directory"
            if exc.errno in (errno.ELOOP, errno.ENOTDIR)
            else exc.strerror
        )
        raise LiteShareError(_unsafe_socket_dir(directory, str(why))) from exc
    try:
        info = os.fstat(fd)
        if info.st_uid != os.getuid():
            owner = f"it is owned by uid {info.st_uid}, not by this user (uid {os.getuid()})"
            raise LiteShareError(_unsafe_socket_dir(directory, owner))
        if stat.S_IMODE(info.st_mode) != 0o700:
            os.fchmod(fd, 0o700)
    finally:
        os.close(fd)


def _unsafe_socket_dir(directory: Path, why: str) -> str:
    return (
        f"refusing the Milvus Lite socket directory {str(directory)!r}: {why}, so another user could "
        "serve a socket in its place; remove it, or set TMPDIR to a directory of your own"
    )


def socket_answers(path: Path) -> bool:
    """Whether something accepts connections on the unix socket (a stale file refuses)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        try:
            sock.connect(str(path))
        except OSError:
            return False
        return True


def lock_holder(db_path: Path) -> int | None:
    """The PID holding milvus_lite's flock on db_path, from /proc/locks (None if unknown)."""
    try:
        inode = (db_path / LOCK_FILENAME).stat().st_ino
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split()
        # "1: FLOCK  ADVISORY  WRITE 4242 00:2f:123456 0 EOF"
        if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5].rsplit(":", 1)[-1] == str(inode):
            with contextlib.suppress(ValueError):
                return int(parts[4])
    return None


def _describe(pid: int) -> str:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\x00", b" ").decode(errors="replace")
    except OSError:
        return f"PID {pid}"
    return f"PID {pid} ({cmdline.strip()[:120]})"


def locked_message(db_path: Path, timeout_s: float) -> str:
    """One line: who holds the directory, and the ways out."""
    pid = lock_holder(db_path)
    holder = _describe(pid) if pid is not None else "another process"
    return (
        f"the Milvus Lite data at {str(db_path)!r} is held by {holder}, which does not share it "
        f"(no answer on {socket_path(db_path)} within {timeout_s:g}s); stop that process, "
        "use another --data-dir, or set milvus.uri to a Milvus server"
    )
