"""`peaks`: measure the roofs and write peaks.json, peaks.csv and roofline.png."""

from __future__ import annotations

import time


def add_args(p) -> None:
    p.add_argument("--quick", action="store_true", help="fewer, smaller points (~1.5 minutes)")
    p.add_argument("--out", default="results/microbench", help="output folder")
    p.add_argument("--rounds", type=int, default=None,
                   help="interleaved rounds of the main roofs beside the peer programs "
                        "(default 3, quick 2)")
    p.add_argument("--compare", action="store_true",
                   help="a longer comparison with the peers: 5 rounds, each printed")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def print_summary(result: dict, per_round: bool = False) -> None:
    """The roofs (each with the program that reached it), their stability and ratio to the
    best peer, what XLA reaches, the hierarchy check, drift and every flagged value."""
    from microbench.plots import fmt_si

    print(f"machine: {result['machine']}  ({result['wall_s']:.0f} s)")
    for r in result["roofs"]["compute"] + result["roofs"]["memory"]:
        unit = "FLOP/s" if r["kind"] == "compute" else "B/s"
        extra = ""
        if r.get("ratio_roof_over_best_peer") is not None:
            extra = (f"  roof/best peer {r['ratio_roof_over_best_peer']:.3f}, rounds spread "
                     f"{r['spread']:.0%}{'  UNSTABLE (> 10%)' if r['unstable'] else ''}")
        flag = "  SUSPECT" if r.get("suspect") else ""
        print(f"  {r['name']:<24} {fmt_si(r['value'], unit):>14}   [{r['source']}]{extra}{flag}")
    for r in result["roofs"].get("compiler", []):
        unit = "FLOP/s" if r["kind"] == "compute" else "B/s"
        print(f"  compiler: {r['name']:<30} {fmt_si(r['value'], unit):>14}   [{r['source']}]")
    for ridge in result["roofs"].get("ridges", []):
        print(f"  {ridge['label']}")
    spec = result["spec"] or {}
    for dtype, v in spec.get("peak_flops", {}).items():
        bound = (spec.get("derivation") or {}).get("bound", "ceiling")
        print(f"  {bound} {dtype:<12} {fmt_si(v, 'FLOP/s'):>14}   [{spec['name']}]")
    for c in (result.get("hierarchy") or {}).get("checks", []):
        print(f"  hierarchy {c['smaller']} >= {c['larger']}: "
              f"{'ok' if c['ok'] else 'VIOLATED: ' + c['reason']}")
    for metric, d in (result.get("drift") or {}).items():
        vals = ", ".join(f"{p['value'] / 1e9:.3g}" for p in d["points"])
        print(f"  drift {metric}: best program per round {vals} (G/s), spread {d['spread']:.0%}")
    if per_round:
        for rnd in result.get("rounds", []):
            print(f"  round {rnd['round'] + 1}:")
            for p in rnd["programs"]:
                print(f"    {p['metric']:<13} {p['value'] / 1e9:9.3f} G/s  {p['program']}")
    entries = [e for k in ("gemm", "vector", "bandwidth") for e in result[k]]
    entries += result["sweep"]["points"] + result["intensity"]["points"]
    for e in entries:
        if e["suspect"]:
            print(f"  SUSPECT: {e['reason']}")
    for block in (result.get("main_roofs") or {}).values():
        for reason in block.get("suspect", []):
            print(f"  SUSPECT: {reason}")
    for r in result["roofs"]["compute"] + result["roofs"]["memory"]:
        if r.get("suspect"):
            print(f"  SUSPECT roof {r['name']}: {r['reason']}")


def run(args) -> int:
    from microbench.roofs.peaks import measure_peaks

    if args.rounds is not None and args.rounds < 1:
        raise ValueError(f"--rounds {args.rounds}: must be a positive integer")
    t0 = time.perf_counter()
    rounds = 5 if args.compare and args.rounds is None else args.rounds
    result = measure_peaks(args.quick, args.out, progress=not args.no_progress, rounds_=rounds)
    print_summary(result, per_round=args.compare)
    print(f"wrote {args.out}/peaks.json, peaks.csv, roofline.png "
          f"in {time.perf_counter() - t0:.0f} s")
    return 0
