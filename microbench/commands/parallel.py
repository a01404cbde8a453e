"""`parallel`: when tensor parallelism stops paying, and expert parallelism's all-to-all
against the expert weight bytes, on spec hardware from the analytic cost model (no JAX run,
no measurement: seconds). The study is microbench/studies/parallel.py."""

from __future__ import annotations

import time

from microbench.commands.study import add_output, finish, ints, names

# option -> (Setup field, parser, help); None keeps the field's default
OPTIONS = {
    "--device": ("device", str, "hardware database device of the TP study"),
    "--models": ("models", names, "dense presets of the TP study, comma-separated"),
    "--batches": ("batches", ints, "decode batches of the TP study"),
    "--context": ("context", int, "tokens already in the KV cache"),
    "--compare-link": ("compare_link", str, "link drawn beside the device's scale-up link"),
    "--max-tp": ("max_tp", int, "largest TP degree (capped at the scale-up domain)"),
    "--ep-device": ("ep_device", str, "device of the EP study"),
    "--ep-model": ("ep_model", str, "MoE preset of the EP study"),
    "--ep-degrees": ("ep_degrees", ints, "expert-parallel degrees"),
    "--ep-batches": ("ep_batches", ints, "decode tokens per device of the EP study"),
    "--threshold": ("threshold", float, "speedup per TP doubling that still pays"),
}


def add_args(p) -> None:
    for option, (field, kind, text) in OPTIONS.items():
        p.add_argument(option, type=kind, default=None, help=f"{text} (Setup.{field})")
    add_output(p, "results/parallel")


def setup_of(args):
    from microbench.studies.parallel import Setup

    fields = {field: getattr(args, option[2:].replace("-", "_"))
              for option, (field, _, _) in OPTIONS.items()}
    setup = Setup(**{k: v for k, v in fields.items() if v is not None})
    setup.check({field: option for option, (field, _, _) in OPTIONS.items()})
    return setup


def run(args) -> int:
    from microbench.files import check_writable_dir
    from microbench.studies.parallel import study

    t0 = time.perf_counter()
    setup = setup_of(args)  # bad input fails here, before the output folder is touched
    check_writable_dir(args.out)
    result = study(setup)
    result["wall_s"] = time.perf_counter() - t0
    return finish("parallel", result, args.out, t0, plot=not args.no_plot)
