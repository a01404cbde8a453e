"""`phases`: time the model's phases against this machine's roofs (or print the speed report)."""

from __future__ import annotations

import dataclasses
import math
import os
import time
from pathlib import Path


def _ints(text: str) -> tuple[int, ...]:
    """"1,2,4" -> (1, 2, 4); a whole number may be written 1e3 (then checked like any other)."""
    import argparse

    out = []
    for v in text.split(","):
        try:
            out.append(int(v))
        except ValueError:
            try:
                f = float(v)
            except ValueError:
                f = math.nan
            if not f.is_integer():
                raise argparse.ArgumentTypeError(f"{v.strip()!r} is not a whole number") from None
            out.append(int(f))
    return tuple(out)


def jnp_itemsize(dtype: str) -> int:
    import numpy as np

    return 2 if dtype in ("bfloat16", "float16") else np.dtype(dtype).itemsize


def add_args(p) -> None:
    p.add_argument("--quick", action="store_true", help="fewer points (~20 s after the peaks)")
    p.add_argument("--out", default="results/microbench", help="output folder")
    p.add_argument("--peaks", help="a saved peaks.json to predict with (default: OUT/peaks.json "
                   "if present, else the roofs are measured first, quick, in this run)")
    p.add_argument("--model", help="preset of the sweeps (default: bench)")
    p.add_argument("--variants",
                   help="comma-separated variants (see microbench.phases.sweeps.variants())")
    p.add_argument("--batches", type=_ints, help="batch sweep, e.g. 1,2,4,8")
    p.add_argument("--contexts", type=_ints, help="context sweep, e.g. 256,1024,4096")
    p.add_argument("--prefill-len", type=int, help="prompt length of the prefill points")
    p.add_argument("--report", action="store_true",
                   help="only the speed report: medium-model decode vs DRAM bandwidth, prefill "
                        "vs GEMM roof, and the PyTorch peer")
    p.add_argument("--no-peer", action="store_true", help="skip the PyTorch peer in --report")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    from microbench.commands.run import add_backend

    add_backend(p)


def _peaks(args, parser_error, out_dir) -> dict:
    """The saved peaks (--peaks, else OUT/peaks.json), or quick ones measured into out_dir."""
    from microbench import machines
    from microbench.schema import KIND_PEAKS, read_result

    path = Path(args.peaks) if args.peaks else Path(args.out) / "peaks.json"
    if path.exists():
        result = read_result(path)
        if result["kind"] != KIND_PEAKS:
            parser_error(f"--peaks {path}: kind {result['kind']!r}, expected {KIND_PEAKS!r}")
        theirs, here = machines.result_machine(result), machines.this_machine()
        if theirs is not None and theirs != here:  # the phases are drawn on these roofs
            parser_error(f"--peaks {path}: measured on {theirs}, and this machine is {here}; "
                         "phases are predicted with their own machine's roofs")
        return result
    if args.peaks:
        parser_error(f"--peaks {path}: no such file")
    from microbench.roofs.peaks import measure_peaks

    return measure_peaks(True, out_dir, progress=not args.no_progress)


def plan_from_args(args, parser_error):
    """The sweep plan: quick or default, with any field the options override."""
    import refmodel
    from microbench.phases import sweeps

    plan = sweeps.quick_plan() if args.quick else sweeps.PhasePlan()
    changes = {}
    if args.model:
        names = sorted(refmodel.presets.PRESETS)
        if args.model not in names:
            parser_error(f"--model {args.model!r}: choose one of {names}")
        cfg = refmodel.presets.get(args.model)
        need = refmodel.costs.param_counts(cfg)["total"] * jnp_itemsize(cfg.dtype)
        have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        if need > have / 2:
            parser_error(f"--model {args.model!r}: {need / 1e9:.0f} GB of weights does not fit "
                         f"half of this machine's {have / 1e9:.0f} GB; real presets are counted, "
                         "not run: `python -m refmodel costs --preset NAME`")
        changes["model"] = args.model
    if args.variants:
        variants = tuple(v.strip() for v in args.variants.split(","))
        bad = [v for v in variants if v not in sweeps.variants()]
        if bad:
            parser_error(f"--variants {bad}: choose from {list(sweeps.variants())}")
        changes["variants"] = variants
        changes["context_variants"] = tuple(v for v in variants if v != sweeps.MOE)
    for field in ("batches", "contexts", "prefill_len"):
        value = getattr(args, field)
        if value is not None:
            if min(value if isinstance(value, tuple) else (value,)) <= 0:
                parser_error(f"--{field.replace('_', '-')} {value}: must be positive")
            changes[field] = value
    from microbench.commands.run import check_backend

    check_backend(args.backend)
    changes["backend"] = args.backend
    plan = dataclasses.replace(plan, **changes)
    need, job = sweeps.plan_memory(plan)
    have = available_memory()
    if need > have:
        parser_error(f"--batches/--contexts/--prefill-len: the largest point ({job.variant} "
                     f"{job.phase}, batch {job.batch}, context {job.context}) needs about "
                     f"{fmt_bytes(need)} of memory (weights, cache and activations), more than "
                     f"the {fmt_bytes(have)} this machine has available")
    return plan


def available_memory() -> float:
    """Bytes a run may allocate: MemAvailable, else the physical memory."""
    from microbench import sysinfo

    have = sysinfo.mem_available_bytes()
    return have if have else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def fmt_bytes(n: float) -> str:
    return f"{n / 1e9:.3g} GB" if n < 1e15 else f"{n:.2e} bytes"


def run(args) -> int:
    from microbench import harness
    from microbench.files import output_set, printable_lines
    from microbench.phases import suite
    from microbench.phases.report import measure_report
    from microbench.plots import summary

    def parser_error(message):  # one line from the command line's error handler (cli.main)
        raise ValueError(message)

    t0 = time.perf_counter()
    plan = plan_from_args(args, parser_error)
    with output_set(args.out) as out:  # the quick peaks it may measure and its results: one set
        peaks = _peaks(args, parser_error, out)
        if args.report:
            rep = measure_report(peaks, peer=not args.no_peer, backend=plan.backend)
            rep["environment"] = harness.environment()
            harness.write_json_atomic(out / "report.json", rep)
        else:
            result = suite.measure_phases(plan, peaks, args.quick, out,
                                          progress=not args.no_progress)
    if args.report:
        print(printable_lines(summary.format_report(rep)))
        print(f"wrote {args.out}/report.json in {time.perf_counter() - t0:.0f} s")
        return 0
    print(printable_lines(summary.summary_markdown(peaks, result)))  # names from --peaks
    print(f"wrote {args.out}/phases.json in {time.perf_counter() - t0:.0f} s")
    return 0
