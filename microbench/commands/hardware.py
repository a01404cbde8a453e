"""`hardware`: list the spec database, or show one device in full."""

from __future__ import annotations

import json


def add_args(p) -> None:
    p.add_argument("name", nargs="?", help="show one device in full (JSON)")
    p.add_argument("--device-file", action="append", default=[],
                   help="also load a device of your own from this JSON file")


def run(args) -> int:
    from microbench import hardware
    from microbench.plots import fmt_si

    for path in args.device_file:
        hardware.add_device(hardware.load_device(path))
    if args.name:
        print(json.dumps(hardware.get(args.name).to_dict(), indent=1))
        return 0
    for name in hardware.list_devices():
        dev = hardware.get(name)
        flops = ", ".join(f"{k} {fmt_si(v, 'FLOP/s')}" for k, v in dev.peak_flops.items())
        bw = ", ".join(f"{k} {fmt_si(v, 'B/s')}" for k, v in dev.memory_bandwidth.items())
        ridge = (f"ridge {hardware.ridge_point(dev):.3g} FLOP/B"
                 if dev.memory_bandwidth else "ridge n/a")
        print(f"{name}\n    {flops}\n    {bw or 'bandwidth: not known'}; {ridge}")
    return 0
