"""`decode`: the decode race (microbench.studies.decode): our decode step with XLA's and the
native kernel's weight products, in float32 and quantized (int8, int4), against the C read,
numpy's GEMM, llama.cpp in F32 and in its own Q8_0, Q4_0 and Q4_K_M files, and transformers,
in interleaved rounds; then each format's greedy agreement and quality (KL from float32 on
held-out text), a w8a8 prefill against float32 and the public step beside the raw one."""

from __future__ import annotations

import dataclasses
import time

from microbench.commands.study import add_output, finish, progress_bar


def _batches(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(b) for b in text.split(","))
    except ValueError:
        raise ValueError(f"--batches {text!r}: allowed a comma-separated list of positive "
                         "integers, e.g. 1,2,4,8") from None


def add_args(p) -> None:
    p.add_argument("--quick", action="store_true",
                   help="the `bench` model, batches 1 and 4, 2 rounds, no peers, quality on "
                        "the micro model: ~2 minutes")
    p.add_argument("--model", default=None, help="preset (default llama-309m)")
    p.add_argument("--context", type=int, default=None, help="tokens in the cache (default 128)")
    p.add_argument("--batches", type=_batches, default=None, help="e.g. 1,2,4,8")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 3)")
    p.add_argument("--no-peers", action="store_true", help="skip llama.cpp and transformers")
    p.add_argument("--quality-model", default=None,
                   help="training recipe whose held-out text the formats' KL is taken on "
                        "(default target; --quick: micro)")
    add_output(p, "results/decode")


def run(args) -> int:
    from microbench import harness
    from microbench.files import check_writable_dir
    from microbench.studies.decode import QUICK, Setup, measure

    t0 = time.perf_counter()
    setup = QUICK if args.quick else Setup()
    changes = {f: v for f, v in (("model", args.model), ("context", args.context),
                                 ("batches", args.batches), ("rounds", args.rounds),
                                 ("quality_model", args.quality_model))
               if v is not None}
    if args.no_peers:
        changes["peers"] = False
    setup = dataclasses.replace(setup, **changes)
    setup.check()
    check_writable_dir(args.out)
    with progress_bar("decode race", unit="step") as progress:
        result = measure(setup, progress)
    result["environment"] = harness.environment()
    result["wall_s"] = time.perf_counter() - t0
    return finish("decode", result, args.out, t0, plot=not args.no_plot)
