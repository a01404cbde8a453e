"""`speculative`: speculative decoding on the trained byte-level pair: acceptance vs k,
measured vs predicted speedup, the verify step on the roofline, batch where it stops paying."""

from __future__ import annotations

import dataclasses
import tempfile
import time
from pathlib import Path

DEFAULT_PEAKS = ("results/microbench/peaks.json", "figures/data/peaks.json")


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"{text!r}: give comma-separated integers") from None


def add_args(p) -> None:
    p.add_argument("--quick", action="store_true",
                   help="the micro pair (trained in seconds), few tokens: about a minute")
    p.add_argument("--ks", type=_ints, default=None, help="comma list of k (proposals)")
    p.add_argument("--batches", type=_ints, default=None,
                   help="comma list of batch sizes for the verify/decode cost ratio")
    p.add_argument("--prompts", type=int, default=None, help="prompts (validation files)")
    p.add_argument("--new-tokens", type=int, default=None, help="tokens generated per prompt")
    p.add_argument("--peaks", default=None,
                   help="peaks.json with this machine's roofs for the roofline panel (default: "
                        f"the first of {', '.join(DEFAULT_PEAKS)} that exists; none: no roofs)")
    p.add_argument("--out", default="results/speculative", help="output folder")
    p.add_argument("--no-plot", action="store_true", help="write the JSON only")


def run(args) -> int:
    from tqdm import tqdm

    from microbench import harness
    from microbench.files import output_set, read_json, write_json_atomic, write_text_atomic
    from microbench.speculative import QUICK, Setup, measure, roofs_from_peaks

    t0 = time.perf_counter()
    setup = QUICK if args.quick else Setup()
    changes = {f: getattr(args, a) for f, a in (("ks", "ks"), ("batches", "batches"),
                                                 ("prompts", "prompts"),
                                                 ("new_tokens", "new_tokens"))
               if getattr(args, a) is not None}
    setup = dataclasses.replace(setup, **changes)
    setup.check()
    if args.peaks is not None and not Path(args.peaks).is_file():
        raise ValueError(f"--peaks {args.peaks}: no such file")
    peaks_path = args.peaks or next((p for p in DEFAULT_PEAKS if Path(p).is_file()), None)
    roofs = roofs_from_peaks(read_json(peaks_path), peaks_path) if peaks_path else None
    with output_set(args.out) as out:
        with tqdm(desc="speculative", unit="part", leave=False) as bar:
            def progress(what: str) -> None:
                bar.set_postfix_str(what)
                bar.update(1)

            result = measure(setup, roofs, progress)
        result["environment"] = harness.environment()
        result["wall_s"] = time.perf_counter() - t0
        write_json_atomic(out / "speculative.json", result)
        write_json_atomic(Path(tempfile.gettempdir()) / "speculative-last.json", result)
        from microbench.plots.speculative import draw_speculative, speculative_summary

        summary = speculative_summary(result)
        write_text_atomic(out / "speculative.md", summary + "\n")
        wrote = [Path(args.out) / "speculative.json", Path(args.out) / "speculative.md"]
        if not args.no_plot:
            wrote += [Path(args.out) / p.name for p in draw_speculative(result, out)]
    print(summary)
    print(f"wrote {', '.join(map(str, wrote))} in {time.perf_counter() - t0:.0f} s")
    return 0
