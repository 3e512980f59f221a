"""Start and stop a Milvus 2.3 standalone server from the ``milvus`` PyPI package, on loopback.

A module of the test package: the ``--milvus-server`` session fixture (tests/conftest.py), the
server benchmarks (bench/server_bench.py) and ``make test`` import it, and ``make milvus-start``
and ``make milvus-stop`` run it from the repository root::

    python -m tests.milvus_server start --data /tmp/milvus-test   # prints the URI
    python -m tests.milvus_server stop --data /tmp/milvus-test

Every port is chosen free at start: ``milvus-server`` otherwise insists on 19530, and its
embedded etcd listens on 2379/2380 whatever ``--etcd-port`` says, so two servers on one machine
collide. The package's ``MilvusServer`` is therefore driven from this module (the ``_run`` action)
with an embedded-etcd config of our own and every component advertising 127.0.0.1. The server
runs in its own process group, so stop ends the runner, the Milvus binary and its etcd together;
``<data>/lookup-knowledge-server.json`` records the group and the URI.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MILVUS_VERSION = "2.3.5"
STATE_FILE = "lookup-knowledge-server.json"
# The port settings of the package's config template (`milvus-server --help` lists them as flags).
PORT_KEYS = (
    "proxy_port",
    "etcd_port",
    "root_coord_port",
    "proxy_internal_port",
    "query_coord_port",
    "query_node_port",
    "index_coord_port",
    "index_node_port",
    "data_coord_port",
    "data_node_port",
)
COMPONENTS = ("rootCoord", "proxy", "queryCoord", "queryNode", "indexNode", "dataCoord", "dataNode")
_EMBED_MARKER = "  use:\n    embed: true"


class MilvusServerError(RuntimeError):
    """The server cannot be installed, started or reached; the message says why."""


@dataclass(frozen=True)
class RunningServer:
    uri: str
    pid: int
    data_dir: str
    log: str


def package_problem() -> str | None:
    """Why the pinned ``milvus`` package cannot be used (None when it can)."""
    try:
        import milvus
    except ImportError:
        return (
            f"the milvus=={MILVUS_VERSION} package is not installed (pip install 'milvus=={MILVUS_VERSION}')"
        )
    version = getattr(milvus, "__version__", "?")
    if version != MILVUS_VERSION:
        return f"milvus {version} is installed, but the tests pin {MILVUS_VERSION}"
    return None


def _free_ports(count: int) -> list[int]:
    # Hold every socket until all are chosen, so no two flags get the same port.
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _answers(uri: str) -> bool:
    from pymilvus import MilvusClient

    try:
        client = MilvusClient(uri=uri, timeout=3)
    except Exception:  # not up yet: any connection error means "try again"
        return False
    try:
        client.list_collections()
        return True
    except Exception:  # the proxy listens before the coordinators are ready
        return False
    finally:
        client.close()


def start(data_dir: Path, *, timeout_s: float = 240.0) -> RunningServer:
    """Start a server on free loopback ports with its state under data_dir; returns when it answers."""
    problem = package_problem()
    if problem:
        raise MilvusServerError(problem)
    data_dir = data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    existing = running(data_dir)
    if existing is not None:
        raise MilvusServerError(f"a server already runs on {data_dir} (pid {existing.pid}, {existing.uri})")
    free = _free_ports(len(PORT_KEYS) + 1)
    ports = dict(zip((*PORT_KEYS, "etcd_peer_port"), free, strict=True))
    args = [
        sys.executable,
        "-m",
        "tests.milvus_server",
        "_run",
        "--data",
        str(data_dir),
        "--ports",
        json.dumps(ports),
    ]
    log = data_dir / "runner.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            args,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    server = RunningServer(f"http://127.0.0.1:{ports['proxy_port']}", proc.pid, str(data_dir), str(log))
    (data_dir / STATE_FILE).write_text(json.dumps(asdict(server)))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            _forget(data_dir)
            raise MilvusServerError(
                f"the Milvus server exited with code {proc.returncode} during start; see {log} "
                f"and {data_dir / 'logs'}"
            )
        if _answers(server.uri):
            return server
        time.sleep(1.0)
    stop(data_dir)
    raise MilvusServerError(
        f"the Milvus server did not answer at {server.uri} within {timeout_s:g}s; see {log}"
    )


def _run(data_dir: Path, ports: dict[str, int]) -> int:
    """The process-group leader: run the package's MilvusServer in the foreground until SIGTERM."""
    from milvus import MilvusServer, MilvusServerConfig

    server = MilvusServer(MilvusServerConfig(), wait_for_started=False)
    server.set_base_dir(str(data_dir))
    for key in PORT_KEYS:
        server.config.set(key, ports[key])
    for component in COMPONENTS:
        server.config.set(f"{component}.ip", "127.0.0.1")
    peer = f"http://127.0.0.1:{ports['etcd_peer_port']}"
    etcd_config = data_dir / "configs" / "embed-etcd.yaml"
    etcd_config.parent.mkdir(parents=True, exist_ok=True)
    etcd_config.write_text(
        f"listen-client-urls: http://127.0.0.1:{ports['etcd_port']}\n"
        f"advertise-client-urls: http://127.0.0.1:{ports['etcd_port']}\n"
        f"listen-peer-urls: {peer}\ninitial-advertise-peer-urls: {peer}\n"
        f"initial-cluster: default={peer}\n"
    )
    template = server.config.template_text
    if _EMBED_MARKER not in template:
        print(f"error: the milvus package's config template changed; {_EMBED_MARKER!r} not found")
        return 2
    server.config.template_text = template.replace(
        _EMBED_MARKER, f"  config:\n    path: {etcd_config}\n{_EMBED_MARKER}"
    )

    def terminate(*_: object) -> None:
        server.stop()
        sys.exit(0)

    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGINT, terminate)
    server.start()
    server.wait()
    return 0


def running(data_dir: Path) -> RunningServer | None:
    """The server recorded under data_dir, if its process group is still alive."""
    state = data_dir / STATE_FILE
    if not state.exists():
        return None
    server = RunningServer(**json.loads(state.read_text()))
    try:
        os.killpg(server.pid, 0)
    except ProcessLookupError:
        _forget(data_dir)
        return None
    except PermissionError:
        return server
    return server


def stop(data_dir: Path, *, grace_s: float = 10.0) -> bool:
    """Stop the server recorded under data_dir (the whole process group); False if none ran."""
    server = running(data_dir.resolve())
    if server is None:
        return False
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(server.pid, os.WNOHANG)
        try:
            os.killpg(server.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
    _forget(data_dir.resolve())
    return True


def _forget(data_dir: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        (data_dir / STATE_FILE).unlink()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.milvus_server", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("action", choices=["start", "stop", "status", "_run"])
    parser.add_argument("--data", type=Path, required=True, help="the server's own data directory")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds to wait for start")
    parser.add_argument("--ports", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.action == "_run":
        return _run(args.data, json.loads(args.ports))
    if args.action == "start":
        try:
            server = start(args.data, timeout_s=args.timeout)
        except MilvusServerError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(server.uri)
        return 0
    if args.action == "stop":
        return 0 if stop(args.data) else 1
    found = running(args.data.resolve())
    print(found.uri if found else "not running")
    return 0 if found else 1


if __name__ == "__main__":
    sys.exit(main())
