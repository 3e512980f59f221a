"""``make bench`` part three: server capacity over HTTP, and a soak.

Capacity: a ``serve --transport streamable-http --stateless`` process over the ingested sample
knowledge base (governance off, so every call retrieves; no load shedding) is driven by
``bench.raw_client``, a separate and cheap process (raw HTTP, no schema validation). The floor
is the median latency of one lookup alone (one connection, back to back); capacity is the
highest lookups/s over 2, 4 and 8 connections. The figure is capacity x floor: 1.0 means the
server at saturation does as much as one lookup after another would. Where the rest goes is
read from /proc: the server's CPU seconds per lookup alone and saturated, the client's, and the
machine's other load.

Soak: the same server with its defaults (load shedding on) under 4 connections for
``LOOKUP_BENCH_SOAK_S`` seconds (default 1800; 0 skips it); RSS, WAL size and p95 are reported
for the first and the last window. Writes ``bench/results/capacity.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench import machine
from bench.load import SAMPLE_KB
from storage.log_retention import wal_bytes
from tests.helpers import free_port, wait_for_port

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
TICKS = os.sysconf("SC_CLK_TCK")
IDLE_S = 10.0


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine has spent not idle."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(values) - values[3] - values[4]) / TICKS


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@contextlib.contextmanager
def served(data_dir: Path, logs: Path, **settings: str) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """A stateless streamable-HTTP server over data_dir; yields (port, process)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOKUP_KNOWLEDGE_")}
    env.update({"LOOKUP_KNOWLEDGE_DATA_DIR": str(data_dir), **settings})
    port = free_port()
    args = [sys.executable, "-m", "server", "serve", "--transport", "streamable-http", "--stateless"]
    with logs.open("wb") as log_file:
        proc = subprocess.Popen(
            [*args, "--port", str(port)], env=env, cwd=ROOT, stdout=log_file, stderr=log_file
        )
    try:
        wait_for_port(port, proc, timeout=120.0)
        yield port, proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def drive(
    port: int, connections: int, seconds: float, work: Path, max_calls: int = 1_000_000
) -> dict[str, Any]:
    """Run bench.raw_client in its own process; its result plus the CPU it cost."""
    out = work / f"calls-{connections}-{time.time_ns()}.json"
    args = [sys.executable, "-m", "bench.raw_client", "--port", str(port), "--connections", str(connections)]
    args += ["--seconds", str(seconds), "--max-calls", str(max_calls), "--out", str(out)]
    subprocess.run(args, cwd=ROOT, check=True, timeout=seconds + 300)
    result: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return result


def phase(
    port: int, pid: int, connections: int, seconds: float, work: Path, max_calls: int
) -> dict[str, Any]:
    """One measured run: lookups/s, latency and where the CPU went."""
    server_cpu, busy = cpu_seconds(pid), machine_busy_seconds()
    result = drive(port, connections, seconds, work, max_calls)
    server_cpu, busy = cpu_seconds(pid) - server_cpu, machine_busy_seconds() - busy
    ok = [latency for _, latency, outcome in result["calls"] if outcome == "ok"]
    if not ok:
        raise RuntimeError(f"no lookup succeeded with {connections} connections: {result['calls'][:3]}")
    wall, client_cpu = result["wall_s"], result["client_cpu_s"]
    return {
        "connections": connections,
        "lookups": len(ok),
        "failed": len(result["calls"]) - len(ok),
        "lookups_per_s": len(ok) / wall,
        "p50_ms": statistics.median(ok) * 1000,
        "p95_ms": _p95(ok) * 1000,
        "server_cpu_ms_per_lookup": server_cpu / len(ok) * 1000,
        "server_cores_used": server_cpu / wall,
        "client_cores_used": client_cpu / wall,
        "other_cores_used": max(0.0, (busy - server_cpu - client_cpu) / wall),
    }


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


def capacity(data_dir: Path, work: Path, seconds: float) -> dict[str, Any]:
    """The floor (one lookup alone) and the lookups/s at saturation, from a separate client process."""
    unbounded = {
        "LOOKUP_KNOWLEDGE_GOVERNANCE__ENABLED": "false",
        "LOOKUP_KNOWLEDGE_RETRIEVAL__MAX_LOOKUPS_IN_FLIGHT": "10000",
    }
    with served(data_dir, work / "capacity-serve.log", **unbounded) as (port, proc):
        drive(port, 1, 60, work, max_calls=20)  # warm-up: the model, the index, the caches
        idle_cpu = cpu_seconds(proc.pid)
        time.sleep(IDLE_S)
        # What the server burns with nothing to do (threads polling or spinning), for the breakdown.
        idle_cores = (cpu_seconds(proc.pid) - idle_cpu) / IDLE_S
        alone = phase(port, proc.pid, 1, seconds, work, max_calls=200)
        saturated = [phase(port, proc.pid, n, seconds, work, max_calls=1_000_000) for n in (2, 4, 8)]
    floor_s = alone["p50_ms"] / 1000
    best = max(saturated, key=lambda p: p["lookups_per_s"])
    return {
        "idle_server_cores": idle_cores,
        "floor_ms": alone["p50_ms"],
        "alone": alone,
        "saturated": saturated,
        "capacity_lookups_per_s": best["lookups_per_s"],
        "ratio_to_floor": best["lookups_per_s"] * floor_s,
        "target": 0.8,
    }


def soak(data_dir: Path, work: Path, seconds: float, sample_s: float = 10.0) -> dict[str, Any]:
    """The defaults under 4 connections for ``seconds``: RSS, WAL and p95, at the start and the end."""
    log_path = data_dir / "log.sqlite"
    with served(data_dir, work / "soak-serve.log") as (port, proc):
        drive(port, 1, 60, work, max_calls=20)
        out = work / "soak-calls.json"
        args = [sys.executable, "-m", "bench.raw_client", "--port", str(port), "--connections", "4"]
        client = subprocess.Popen([*args, "--seconds", str(seconds), "--out", str(out)], cwd=ROOT)
        samples = []
        started = time.time()
        while client.poll() is None:
            sample = {"at": time.time(), "rss_mib": rss_mib(proc.pid), "wal_bytes": wal_bytes(log_path)}
            samples.append(sample)
            with contextlib.suppress(subprocess.TimeoutExpired):
                client.wait(timeout=sample_s)
        calls = json.loads(out.read_text(encoding="utf-8"))["calls"]
    window = max(sample_s, min(60.0, seconds / 10))
    return {
        "seconds": seconds,
        "calls": len(calls),
        "busy": sum(1 for _, _, outcome in calls if outcome == "busy"),
        "failed": sum(1 for _, _, outcome in calls if outcome not in ("ok", "busy")),
        "start": _window(calls, samples, started, started + window),
        "end": _window(calls, samples, started + seconds - window, started + seconds),
        "max_wal_bytes": max(s["wal_bytes"] for s in samples),
        "max_rss_mib": max(s["rss_mib"] for s in samples),
    }


def _window(calls: list[Any], samples: list[dict[str, float]], since: float, until: float) -> dict[str, Any]:
    """p95 of the calls started in [since, until), and the last RSS and WAL sample taken in it."""
    latencies = [latency for start, latency, outcome in calls if since <= start < until and outcome == "ok"]
    inside = [s for s in samples if since <= s["at"] < until] or [
        min(samples, key=lambda s: abs(s["at"] - until))
    ]
    return {
        "lookups": len(latencies),
        "p95_ms": _p95(latencies) * 1000 if latencies else None,
        "rss_mib": inside[-1]["rss_mib"],
        "wal_bytes": inside[-1]["wal_bytes"],
    }


def _ingested(work: Path) -> Path:
    data_dir = work / "data"
    print("ingesting the sample knowledge base ...", file=sys.stderr)
    ingest = [sys.executable, "-m", "server", "ingest", str(SAMPLE_KB), "--data-dir", str(data_dir)]
    subprocess.run(ingest, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return data_dir


def report(result: dict[str, Any]) -> str:
    """The lines make bench prints."""
    cap = result["capacity"]
    lines = [
        f"capacity: {cap['capacity_lookups_per_s']:.1f} lookups/s at saturation; floor {cap['floor_ms']:.1f} ms "
        f"(1/floor = {1000 / cap['floor_ms']:.1f}/s); ratio {cap['ratio_to_floor']:.2f} (target 0.8); "
        f"idle server {cap['idle_server_cores']:.2f} cores",
    ]
    for p in [cap["alone"], *cap["saturated"]]:
        lines.append(
            f"  {p['connections']} conn: {p['lookups_per_s']:.1f}/s p50 {p['p50_ms']:.0f} ms p95 {p['p95_ms']:.0f} ms; "
            f"server {p['server_cpu_ms_per_lookup']:.1f} ms CPU/lookup, cores: server {p['server_cores_used']:.2f} "
            f"client {p['client_cores_used']:.2f} other {p['other_cores_used']:.2f}"
        )
    soaked = result.get("soak")
    if soaked:
        lines.append(
            f"soak {soaked['seconds']:.0f} s, {soaked['calls']} calls ({soaked['busy']} busy, {soaked['failed']} failed): "
            f"start RSS {soaked['start']['rss_mib']:.0f} MiB WAL {soaked['start']['wal_bytes']} B "
            f"p95 {soaked['start']['p95_ms']:.0f} ms; end RSS {soaked['end']['rss_mib']:.0f} MiB "
            f"WAL {soaked['end']['wal_bytes']} B p95 {soaked['end']['p95_ms']:.0f} ms; max WAL {soaked['max_wal_bytes']} B"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.capacity", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each capacity phase")
    default_soak = float(os.environ.get("LOOKUP_BENCH_SOAK_S", "1800"))
    parser.add_argument("--soak-seconds", type=float, default=default_soak, help="0 skips the soak")
    parser.add_argument("--data-dir", type=Path, default=None, help="an ingested data directory to copy")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="capacity-") as tmp:
        work = Path(tmp)
        data_dir = (
            _ingested(work) if args.data_dir is None else Path(shutil.copytree(args.data_dir, work / "data"))
        )
        template = work / "template"
        shutil.copytree(data_dir, template)
        result: dict[str, Any] = {"machine": machine.describe(), "load": {"start": machine.load_average()}}
        result["capacity"] = capacity(data_dir, work, args.seconds)
        if args.soak_seconds > 0:
            soak_dir = work / "soak-data"
            shutil.copytree(template, soak_dir)
            result["soak"] = soak(soak_dir, work, args.soak_seconds)
        result["load"]["end"] = machine.load_average()
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "capacity.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(report(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
