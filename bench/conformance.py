"""Run the ONNX backend node tests of the supported ops through tvmsched and write a report.

Usage: python bench/conformance.py [--workers N] [--timeout S] [--write-baseline]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import sys
import time
from collections import Counter
from pathlib import Path

import onnx

from tvmsched.cli.conformance import DEFAULT_TIMEOUT_S, CaseResult, case_ops, collect_cases, run_sweep

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "bench" / "results" / "conformance.md"
BASELINE = ROOT / "tests" / "data" / "conformance_baseline.json"


def main(argv: list[str] | None = None) -> int:
    """Parse the options, run the sweep, write the report (and the baseline when asked)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per case")
    parser.add_argument("--write-baseline", action="store_true", help=f"write {BASELINE.relative_to(ROOT)}")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    cases = collect_cases()
    results = run_sweep(cases, workers=args.workers, timeout_s=args.timeout)
    seconds = time.perf_counter() - start
    passed = sum(r.status == "pass" for r in results)
    summary = f"{passed} passed, {len(results) - passed} failed/errored of {len(results)} cases in the supported set"
    print(f"{summary} ({seconds:.0f} s)")

    ops = {case.name: "+".join(case_ops(case)) for case in cases}
    REPORT.write_text(_report(results, ops, summary, seconds, args.workers))
    print(f"wrote {REPORT.relative_to(ROOT)}")
    if args.write_baseline:
        _write_baseline(results)
        print(f"wrote {BASELINE.relative_to(ROOT)}")
    return 0


def _report(results: list[CaseResult], ops: dict[str, str], summary: str, seconds: float, workers: int) -> str:
    """The Markdown report: setup, pass count, per-op table and the failing cases."""
    import tvm

    command = "python bench/conformance.py " + shlex.join(sys.argv[1:])
    lines = [
        "# ONNX node-test conformance (CPU, llvm)",
        "",
        f"- command: `{command.strip()}`",
        f"- machine: {platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
        f"- Python {platform.python_version()}, onnx {onnx.__version__}, tvm {tvm.__version__}",
        f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"- wall time: {seconds:.0f} s with {workers} worker(s)",
        "",
        f"**{summary}.**",
        "",
        "| op | passed | total |",
        "|---|---:|---:|",
    ]
    total = Counter(ops[r.name] for r in results)
    passed = Counter(ops[r.name] for r in results if r.status == "pass")
    lines += [f"| {op} | {passed[op]} | {total[op]} |" for op in sorted(total)]
    lines += ["", "## Failing cases", "", "| case | status | reason |", "|---|---|---|"]
    lines += [f"| {r.name} | {r.status} | {_cell(r.message)} |" for r in results if r.status != "pass"]
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _write_baseline(results: list[CaseResult]) -> None:
    passing = sorted(r.name for r in results if r.status == "pass")
    BASELINE.parent.mkdir(parents=True, exist_ok=True)
    data = {"onnx_version": onnx.__version__, "count": len(passing), "passing": passing}
    BASELINE.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
