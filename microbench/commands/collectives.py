"""`collectives`: all-reduce, all-gather, reduce-scatter and all-to-all bandwidth against message
size on this machine's devices (emulated host devices on a CPU), beside vendor link specs."""

from __future__ import annotations

import time

from microbench.commands.study import add_output, finish, progress_bar

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
    add_output(p, "results/collectives")


def _links(env: dict) -> list[dict]:
    from microbench import hardware
    from microbench.studies.collectives import links

    names = list(LINKS)
    device = hardware.device_for_environment(env) if env.get("backend") != "cpu" else None
    own = (device.scale_up or {}).get("link") if device is not None else None
    if own:
        names = [own] + [n for n in names if n != own]
    return links(names)


def run(args) -> int:
    from microbench.files import check_writable_dir
    from microbench.studies import collectives as coll

    t0 = time.perf_counter()
    repeats = args.repeats if args.repeats is not None else (5 if args.quick else 10)
    if repeats < 1:
        raise ValueError(f"--repeats {repeats}: at least 1")
    devices, emulated = coll.use_devices(args.devices)  # before anything starts a backend
    sizes = coll.QUICK_SIZES if args.quick else coll.SIZES
    check_writable_dir(args.out)

    from microbench import harness

    with progress_bar("collectives", len(sizes) * len(coll.COLLECTIVES), "point") as progress:
        result = coll.measure(sizes, devices, emulated, repeats=repeats,
                              budget_s=0.05 if args.quick else 1.0, progress=progress)
    result["environment"] = harness.environment()
    result["links"] = _links(result["environment"])
    result["wall_s"] = time.perf_counter() - t0
    return finish("collectives", result, args.out, t0, plot=not args.no_plot)
