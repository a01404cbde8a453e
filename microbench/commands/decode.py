"""`decode`: the decode race of issue 18 (microbench.decode): our decode step with XLA's and
the native kernel's weight products against the C read, numpy's GEMM, llama.cpp and
transformers, in interleaved rounds."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path


def _batches(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(b) for b in text.split(","))
    except ValueError:
        raise ValueError(f"--batches {text!r}: allowed a comma-separated list of positive "
                         "integers, e.g. 1,2,4,8") from None


def add_args(p) -> None:
    p.add_argument("--quick", action="store_true",
                   help="the `bench` model, batches 1 and 4, 2 rounds, no peers: ~1 minute")
    p.add_argument("--model", default=None, help="preset (default llama-309m)")
    p.add_argument("--context", type=int, default=None, help="tokens in the cache (default 128)")
    p.add_argument("--batches", type=_batches, default=None, help="e.g. 1,2,4,8")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 3)")
    p.add_argument("--no-peers", action="store_true", help="skip llama.cpp and transformers")
    p.add_argument("--out", default="results/decode", help="output folder")
    p.add_argument("--no-plot", action="store_true", help="write the JSON and summary only")


def run(args) -> int:
    from tqdm import tqdm

    from microbench import harness
    from microbench.decode import QUICK, Setup, measure
    from microbench.files import (
        check_writable_dir,
        output_set,
        write_json_atomic,
        write_text_atomic,
    )
    from microbench.plots.decode import decode_summary

    t0 = time.perf_counter()
    setup = QUICK if args.quick else Setup()
    changes = {f: v for f, v in (("model", args.model), ("context", args.context),
                                 ("batches", args.batches), ("rounds", args.rounds))
               if v is not None}
    if args.no_peers:
        changes["peers"] = False
    setup = dataclasses.replace(setup, **changes)
    setup.check()
    check_writable_dir(args.out)
    with output_set(args.out) as out:
        with tqdm(desc="decode race", unit="step", leave=False) as bar:
            def progress(what: str) -> None:
                bar.set_postfix_str(what)
                bar.update(1)

            result = measure(setup, progress)
        result["environment"] = harness.environment()
        result["wall_s"] = time.perf_counter() - t0
        write_json_atomic(out / "decode.json", result)
        summary = decode_summary(result)
        write_text_atomic(out / "decode.md", summary + "\n")
        wrote = [Path(args.out) / "decode.json", Path(args.out) / "decode.md"]
        if not args.no_plot:
            from microbench.plots.decode import draw_decode

            wrote += [Path(args.out) / p.name for p in draw_decode(result, out)]
    print(summary)
    print(f"wrote {', '.join(map(str, wrote))} in {time.perf_counter() - t0:.0f} s")
    return 0
