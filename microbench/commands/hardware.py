"""`hardware`: list the spec database, or show one device in full."""

from __future__ import annotations

import json


def add_args(p) -> None:
    p.add_argument("name", nargs="?", help="show one device in full (JSON)")
    p.add_argument("--device-file", action="append", default=[],
                   help="also load a device of your own from this JSON file")
    p.add_argument("--replace", action="store_true",
                   help="let a device file replace a built-in device of the same name")


def run(args) -> int:
    from microbench import hardware
    from microbench.files import printable
    from microbench.plots import fmt_si

    for path in args.device_file:
        device = hardware.load_device(path)
        shadows = device.name in hardware.list_devices()
        try:
            hardware.add_device(device, replace=args.replace)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None
        if shadows:
            print(printable(f"note: {path} replaces the device named {device.name!r}"))
    if args.name:  # json.dumps escapes control characters (ensure_ascii)
        print(json.dumps(hardware.get(args.name).to_dict(), indent=1))
        return 0
    for name in hardware.list_devices():
        dev = hardware.get(name)
        flops = ", ".join(f"{k} {fmt_si(v, 'FLOP/s')}" for k, v in dev.peak_flops.items())
        bw = ", ".join(f"{k} {fmt_si(v, 'B/s')}" for k, v in dev.memory_bandwidth.items())
        ridge = (f"ridge {hardware.ridge_point(dev):.3g} FLOP/B"
                 if dev.memory_bandwidth else "ridge n/a")
        # names and level keys come from users' files: escaped, one line each
        print("\n    ".join(printable(line) for line in
                              (name, flops, f"{bw or 'bandwidth: not known'}; {ridge}")))
    return 0
