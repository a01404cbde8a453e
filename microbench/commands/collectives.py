"""`collectives`: all-reduce, all-gather, reduce-scatter and all-to-all bandwidth against message
size on this machine's devices (emulated host devices on a CPU), beside vendor link specs."""

from __future__ import annotations

import time
from pathlib import Path

# Interconnects drawn beside the measurement (names in microbench/data/hardware.json "links");
# on a GPU or TPU the device's own scale-up link is added first when the database knows it.
LINKS = ("NVLink 4", "TPU v5e ICI", "PCIe 5.0 x16", "InfiniBand NDR")


def add_args(p) -> None:
    p.add_argument("--quick", action="store_true",
                   help="4 sizes from 1 KiB to 4 MiB per device, few samples: seconds")
    p.add_argument("--devices", type=int, default=None,
                   help="emulated CPU devices (default 8 on a CPU backend); refused on GPU/TPU, "
                        "where every real device is used")
    p.add_argument("--repeats", type=int, default=None,
                   help="samples per point at least (default 10; 5 with --quick)")
    p.add_argument("--out", default="results/collectives", help="output folder")
    p.add_argument("--no-plot", action="store_true", help="write the JSON and summary only")


def _links(env: dict) -> list[dict]:
    from microbench import hardware
    from microbench.collectives import links

    names = list(LINKS)
    device = hardware.device_for_environment(env) if env.get("backend") != "cpu" else None
    own = (device.scale_up or {}).get("link") if device is not None else None
    if own:
        names = [own] + [n for n in names if n != own]
    return links(names)


def run(args) -> int:
    from tqdm import tqdm

    from microbench import collectives as coll

    t0 = time.perf_counter()
    repeats = args.repeats if args.repeats is not None else (5 if args.quick else 10)
    if repeats < 1:
        raise ValueError(f"--repeats {repeats}: at least 1")
    devices, emulated = coll.use_devices(args.devices)  # before anything starts a backend
    sizes = coll.QUICK_SIZES if args.quick else coll.SIZES

    from microbench import harness
    from microbench.files import output_set, write_json_atomic, write_text_atomic

    with output_set(args.out) as out:
        total = len(sizes) * len(coll.COLLECTIVES)
        with tqdm(total=total, desc="collectives", unit="point", leave=False) as bar:
            def progress(what: str) -> None:
                bar.set_postfix_str(what)
                bar.update(1)

            result = coll.measure(sizes, devices, emulated, repeats=repeats,
                                  budget_s=0.05 if args.quick else 1.0, progress=progress)
        result["environment"] = harness.environment()
        result["links"] = _links(result["environment"])
        result["wall_s"] = time.perf_counter() - t0
        write_json_atomic(out / "collectives.json", result)
        from microbench.plots.collectives import collectives_summary, draw_collectives

        summary = collectives_summary(result)
        write_text_atomic(out / "collectives.md", summary + "\n")
        wrote = [Path(args.out) / "collectives.json", Path(args.out) / "collectives.md"]
        if not args.no_plot:
            wrote += [Path(args.out) / p.name for p in draw_collectives(result, out)]
    print(summary)
    print(f"wrote {', '.join(map(str, wrote))} in {time.perf_counter() - t0:.0f} s")
    return 0
