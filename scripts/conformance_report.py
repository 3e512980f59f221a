"""Helpers of scripts/conformance: the suite's expected-failures file, and the final summary.

    python scripts/conformance_report.py expected BASELINE OUT
    python scripts/conformance_report.py summary BASELINE SERVE_RESULTS FIXTURE_RESULTS

``summary`` reads the suite's ``<results>/server-<scenario>-<timestamp>/checks.json`` files and
prints passed / not applicable / failed; it exits 1 if any scenario failed unexpectedly, if a
not-applicable scenario passed (a stale baseline entry), or if a listed scenario did not run.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

_RESULT_DIR = re.compile(r"^server-(?P<scenario>.+)-\d{4}-\d{2}-\d{2}T[\d-]+Z$")


def load_baseline(path: Path) -> tuple[dict[str, str], dict[str, str]]:
    data: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return dict(data.get("not_applicable") or {}), dict(data.get("suite_fixtures") or {})


def write_expected(baseline: Path, out: Path) -> None:
    """The suite's --expected-failures file for the run against ``serve``."""
    not_applicable, fixtures = load_baseline(baseline)
    out.write_text(yaml.safe_dump({"server": sorted([*not_applicable, *fixtures])}), encoding="utf-8")


def read_results(directory: Path) -> dict[str, tuple[bool, list[str]]]:
    """scenario -> (every check passed, failure messages)."""
    results: dict[str, tuple[bool, list[str]]] = {}
    for checks_file in sorted(directory.glob("server-*/checks.json")):
        match = _RESULT_DIR.match(checks_file.parent.name)
        if match is None:
            continue
        checks = json.loads(checks_file.read_text(encoding="utf-8"))
        failures = [
            f"{c.get('id')}: {c.get('errorMessage') or c.get('description')}"
            for c in checks
            if c.get("status") != "SUCCESS"
        ]
        results[match.group("scenario")] = (not failures and bool(checks), failures)
    return results


def summarize(baseline: Path, serve_results: Path, fixture_results: Path) -> int:
    not_applicable, fixtures = load_baseline(baseline)
    on_serve, on_fixtures = read_results(serve_results), read_results(fixture_results)
    passed: list[str] = []
    skipped: list[str] = []
    failed: list[str] = []
    for scenario, (ok, failures) in sorted(on_serve.items()):
        if scenario in fixtures:
            continue
        if scenario in not_applicable:
            if ok:
                failed.append(f"{scenario}: passes but is listed as not applicable (stale baseline entry)")
            else:
                skipped.append(scenario)
        elif ok:
            passed.append(scenario)
        else:
            failed.append(f"{scenario}: " + "; ".join(failures))
    for scenario in sorted(fixtures):
        ok, failures = on_fixtures.get(scenario, (False, ["did not run"]))
        if ok:
            passed.append(f"{scenario} (suite fixtures)")
        else:
            failed.append(f"{scenario} (suite fixtures): " + "; ".join(failures))
    for scenario in sorted(set(not_applicable) - set(on_serve)):
        failed.append(f"{scenario}: listed as not applicable but the suite has no such scenario")

    print("\n== conformance summary (official MCP conformance suite, server scenarios)")
    for scenario in passed:
        print(f"  passed          {scenario}")
    for scenario in skipped:
        print(f"  not applicable  {scenario}: {not_applicable[scenario]}")
    for line in failed:
        print(f"  FAILED          {line}")
    print(f"passed {len(passed)} / not applicable {len(skipped)} / failed {len(failed)}")
    return 1 if failed else 0


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "expected":
        write_expected(Path(argv[1]), Path(argv[2]))
        return 0
    if len(argv) == 4 and argv[0] == "summary":
        return summarize(Path(argv[1]), Path(argv[2]), Path(argv[3]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
