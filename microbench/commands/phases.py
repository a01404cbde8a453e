"""`phases`: time the model's phases against this machine's roofs (or print the speed report)."""

from __future__ import annotations

import json
import time
from pathlib import Path


def add_args(p) -> None:
    p.add_argument("--quick", action="store_true", help="fewer points (~20 s after the peaks)")
    p.add_argument("--out", default="results/microbench", help="output folder")
    p.add_argument("--peaks", help="a saved peaks.json to predict with (default: measure the "
                   "roofs first, quick, in this run)")
    p.add_argument("--report", action="store_true",
                   help="only the speed report: medium-model decode vs DRAM bandwidth, prefill "
                        "vs GEMM roof, and the PyTorch peer")
    p.add_argument("--no-peer", action="store_true", help="skip the PyTorch peer in --report")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def _peaks(args) -> dict:
    from microbench.schema import validate_result

    if args.peaks:
        return validate_result(json.loads(Path(args.peaks).read_text()))
    from microbench.peaks import measure_peaks

    return measure_peaks(True, args.out, progress=not args.no_progress)


def run(args) -> int:
    from microbench import harness, suite, sweeps
    from microbench.report import format_report, measure_report

    t0 = time.perf_counter()
    peaks = _peaks(args)
    if args.report:
        rep = measure_report(peaks, peer=not args.no_peer)
        rep["environment"] = harness.environment()
        harness.write_json_atomic(Path(args.out) / "report.json", rep)
        print(format_report(rep))
        print(f"wrote {args.out}/report.json in {time.perf_counter() - t0:.0f} s")
        return 0
    plan = sweeps.QUICK if args.quick else sweeps.PhasePlan()
    result = suite.measure_phases(plan, peaks, args.quick, args.out,
                                  progress=not args.no_progress)
    print(suite.summary_markdown(peaks, result))
    print(f"wrote {args.out}/phases.json in {time.perf_counter() - t0:.0f} s")
    return 0
