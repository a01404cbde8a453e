"""`peaks`: measure the roofs and write peaks.json, peaks.csv and roofline.png."""

from __future__ import annotations

import time


def add_args(p) -> None:
    p.add_argument("--quick", action="store_true", help="fewer, smaller points (~1 minute)")
    p.add_argument("--out", default="results/microbench", help="output folder")
    p.add_argument("--compare", action="store_true",
                   help="also run peer programs (numpy, C STREAM) and report ours/peer ratios")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def _print_summary(result: dict) -> None:
    from microbench.plot import fmt_si

    print(f"machine: {result['machine']}  ({result['wall_s']:.0f} s)")
    for r in result["roofs"]["compute"]:
        print(f"  {r['name']:<28} {fmt_si(r['value'], 'FLOP/s'):>16}   [{r['source']}]")
    for r in result["roofs"]["memory"]:
        print(f"  {r['name']:<28} {fmt_si(r['value'], 'B/s'):>16}   [{r['source']}]")
    spec = result["spec"] or {}
    for dtype, v in spec.get("peak_flops", {}).items():
        print(f"  ceiling {dtype:<20} {fmt_si(v, 'FLOP/s'):>16}   [{spec['name']}]")
    bad = [e for k in ("gemm", "vector", "bandwidth") for e in result[k] if e["suspect"]]
    for e in bad:
        print(f"  SUSPECT: {e['reason']}")
    for key, block in (result.get("compare") or {}).items():
        if isinstance(block, dict) and "ratio_ours_over_best_peer" in block:
            ratio = block["ratio_ours_over_best_peer"]
            best: dict[str, float] = {}
            for p in block["peers"]:
                best[p["name"]] = max(best.get(p["name"], 0.0), p["rate"]["median"])
            for name, value in best.items():
                print(f"  peer {key}: {name}: best round median {value:.4g} {block['unit']}")
            print(f"  {key}: roof / best peer ({block['best_peer']}) = {ratio:.3f}; "
                  f"interleaved median ratio {block['interleaved_median_ratio']:.3f}"
                  if ratio else f"  {key}: no ratio")


def run(args) -> int:
    from microbench.peaks import measure_peaks

    t0 = time.perf_counter()
    result = measure_peaks(args.quick, args.out, progress=not args.no_progress,
                           compare=args.compare)
    _print_summary(result)
    print(f"wrote {args.out}/peaks.json, peaks.csv, roofline.png "
          f"in {time.perf_counter() - t0:.0f} s")
    return 0
