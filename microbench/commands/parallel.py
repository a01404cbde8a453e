"""`parallel`: when tensor parallelism stops paying, and expert parallelism's all-to-all
against the expert weight bytes, on spec hardware from the analytic cost model (no JAX run,
no measurement: seconds). The study is microbench/parallel.py."""

from __future__ import annotations

import time
from pathlib import Path


def _names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in _names(text))
    except ValueError:
        raise ValueError(f"{text!r}: give comma-separated integers") from None


# option -> (Setup field, parser, help); None keeps the field's default
OPTIONS = {
    "--device": ("device", str, "hardware database device of the TP study"),
    "--models": ("models", _names, "dense presets of the TP study, comma-separated"),
    "--batches": ("batches", _ints, "decode batches of the TP study"),
    "--context": ("context", int, "tokens already in the KV cache"),
    "--compare-link": ("compare_link", str, "link drawn beside the device's scale-up link"),
    "--max-tp": ("max_tp", int, "largest TP degree (capped at the scale-up domain)"),
    "--ep-device": ("ep_device", str, "device of the EP study"),
    "--ep-model": ("ep_model", str, "MoE preset of the EP study"),
    "--ep-degrees": ("ep_degrees", _ints, "expert-parallel degrees"),
    "--ep-batches": ("ep_batches", _ints, "decode tokens per device of the EP study"),
    "--threshold": ("threshold", float, "speedup per TP doubling that still pays"),
}


def add_args(p) -> None:
    for option, (field, kind, text) in OPTIONS.items():
        p.add_argument(option, type=kind, default=None, help=f"{text} (Setup.{field})")
    p.add_argument("--out", default="results/parallel", help="output folder")
    p.add_argument("--no-plot", action="store_true", help="write the JSON and summary only")


def setup_of(args):
    from microbench.parallel import Setup

    fields = {field: getattr(args, option[2:].replace("-", "_"))
              for option, (field, _, _) in OPTIONS.items()}
    setup = Setup(**{k: v for k, v in fields.items() if v is not None})
    setup.check({field: option for option, (field, _, _) in OPTIONS.items()})
    return setup


def run(args) -> int:
    from microbench.files import output_set, write_json_atomic, write_text_atomic

    t0 = time.perf_counter()
    setup = setup_of(args)  # bad input fails here, before the output folder is touched
    from microbench.parallel import study
    from microbench.plots.parallel import draw_parallel, parallel_summary

    with output_set(args.out) as out:
        result = study(setup)
        result["wall_s"] = time.perf_counter() - t0
        write_json_atomic(out / "parallel.json", result)
        summary = parallel_summary(result)
        write_text_atomic(out / "parallel.md", summary + "\n")
        wrote = [Path(args.out) / "parallel.json", Path(args.out) / "parallel.md"]
        if not args.no_plot:
            wrote += [Path(args.out) / p.name for p in draw_parallel(result, out)]
    print(summary)
    print(f"wrote {', '.join(map(str, wrote))} in {time.perf_counter() - t0:.1f} s")
    return 0
