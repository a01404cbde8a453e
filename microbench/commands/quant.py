"""`quant`: quantized products, steps and quality: the formulation table, decode and prefill at
every precision beside their counted bytes, bits per byte per weight and KV format."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

DEFAULT_PEAKS = ("results/microbench/peaks.json", "figures/data/peaks.json")


def add_args(p) -> None:
    p.add_argument("--quick", action="store_true",
                   help="a 1024 x 1024 weight, the `small` model, the micro recipe: ~2 minutes")
    p.add_argument("--model", default=None, help="preset of the step timings (default medium)")
    p.add_argument("--rounds", type=int, default=None, help="interleaved timing rounds")
    p.add_argument("--peaks", default=None,
                   help="peaks.json whose DRAM read roof predicts each step (default: the first "
                        f"of {', '.join(DEFAULT_PEAKS)} that exists; none: no prediction)")
    p.add_argument("--out", default="results/quant", help="output folder")
    p.add_argument("--no-plot", action="store_true", help="write the JSON only")


def run(args) -> int:
    from tqdm import tqdm

    from microbench import harness
    from microbench.files import output_set, read_json, write_json_atomic, write_text_atomic
    from microbench.quant import QUICK, Setup, measure
    from microbench.speculative import roofs_from_peaks

    t0 = time.perf_counter()
    setup = QUICK if args.quick else Setup()
    changes = {f: v for f, v in (("model", args.model), ("rounds", args.rounds)) if v is not None}
    setup = dataclasses.replace(setup, **changes)
    setup.check()
    if args.peaks is not None and not Path(args.peaks).is_file():
        raise ValueError(f"--peaks {args.peaks}: no such file")
    peaks_path = args.peaks or next((p for p in DEFAULT_PEAKS if Path(p).is_file()), None)
    roofs = roofs_from_peaks(read_json(peaks_path), peaks_path) if peaks_path else None
    with output_set(args.out) as out:
        with tqdm(desc="quant", unit="part", leave=False) as bar:
            def progress(what: str) -> None:
                bar.set_postfix_str(what)
                bar.update(1)

            result = measure(setup, roofs["memory"] if roofs else None, progress)
        result["roofs"] = roofs
        result["environment"] = harness.environment()
        result["wall_s"] = time.perf_counter() - t0
        write_json_atomic(out / "quant.json", result)
        from microbench.plots.quant import draw_quant, quant_summary

        summary = quant_summary(result)
        write_text_atomic(out / "quant.md", summary + "\n")
        wrote = [Path(args.out) / "quant.json", Path(args.out) / "quant.md"]
        if not args.no_plot:
            wrote += [Path(args.out) / p.name for p in draw_quant(result, out)]
    print(summary)
    print(f"wrote {', '.join(map(str, wrote))} in {time.perf_counter() - t0:.0f} s")
    return 0
