"""`simulate`: the simulator checked against the engine on this machine (each trace run
several times on the engine: the engine's own spread printed beside each simulator's MAPE of
TTFT, TPOT and end-to-end latency, and each predictor's per-step error), then serving at
scale on paper: real models on spec chips with tensor parallelism, prefill/decode and
attention-FFN disaggregation, SRAM-only chips."""

from __future__ import annotations

import dataclasses
import time

from microbench.commands.study import add_output, finish, floats, names, progress_bar

PARTS = ("check", "paper")
QUICK_CHECK = dict(models=("tiny", "tiny+moe"), policies=("mixed",), rate_fractions=(0.5,),
                   requests=6, system_len=64, prompt_len=16, output_len=8, page_size=8,
                   token_budget=32, max_running=4, table_repeats=2, engine_repeats=5)
QUICK_PAPER = dict(models=("llama3-8b",), mixes=(("chat", 256, 32),), rate_fractions=(0.5,),
                   requests=16, batch_caps=(1, 16), pd_designs=((1, 1),),
                   afd_models=("qwen3-30b-a3b",), afd_chips=8, sram_batches=(1, 8),
                   context=1024, max_running=16)


# option -> (part, field, parser, help); None means the part's default (or --quick's)
OPTIONS = {
    "--models": ("check", "models", names, "presets checked against the engine, each "
                 "optionally +<attention kind> or +moe"),
    "--policies": ("check", "policies", names, "scheduler policies of the check"),
    "--rate-fractions": ("check", "rate_fractions", floats,
                         "check rates as fractions of each policy's saturation throughput"),
    "--requests": ("check", "requests", int, "requests per check run"),
    "--engine-repeats": ("check", "engine_repeats", int, "engine runs per trace (their "
                         "spread is what a simulator is judged against; at least 2)"),
    "--device": ("paper", "device", str, "hardware database device of the on-paper studies"),
    "--paper-models": ("paper", "models", names, "presets of the scale-out study"),
    "--pd-model": ("paper", "pd_model", str, "preset of the disaggregation study"),
    "--sram-chip": ("paper", "sram_chip", str, "SRAM-only device"),
}


def add_args(p) -> None:
    p.add_argument("--parts", type=names, default=PARTS,
                   help=f"comma list of {', '.join(PARTS)} (default both)")
    p.add_argument("--config", default=None,
                   help="a JSON (or, on Python >= 3.11, TOML) file {check: {...}, paper: "
                        "{...}} of fields of microbench.studies.simulate.Check / "
                        "microbench.studies.scale.Paper; flags win over it")
    for option, (part, field, kind, text) in OPTIONS.items():
        p.add_argument(option, type=kind, default=None, help=f"{text} ({part}.{field})")
    p.add_argument("--peaks", default=None,
                   help="peaks.json with this machine's roofs for the roofline predictor "
                        "(default: results/microbench/peaks.json, else figures/data/<this "
                        "machine>/peaks.json, each only if this kind of machine measured it; "
                        "else measured now with peaks --quick, about 1.5 minutes)")
    p.add_argument("--quick", action="store_true",
                   help="tiny models and few requests: about a minute")
    add_output(p, "results/simulate")


def _config_file(path: str | None) -> dict:
    if path is None:
        return {}
    from microbench.files import read_json

    if path.endswith(".toml"):
        try:
            import tomllib
        except ImportError:
            raise ValueError(f"--config {path}: TOML needs Python >= 3.11; use JSON") from None
        with open(path, "rb") as f:
            data = tomllib.load(f)
    else:
        data = read_json(path)
    if not isinstance(data, dict) or set(data) - set(PARTS):
        raise ValueError(f"--config {path}: give an object with keys among {PARTS}")
    return data


def setups(args):
    """(Check, Paper) from --quick, --config and the flags, in that order of precedence."""
    from microbench.studies.scale import Paper
    from microbench.studies.simulate import Check

    values = {"check": dict(QUICK_CHECK) if args.quick else {},
              "paper": dict(QUICK_PAPER) if args.quick else {}}
    for part, fields in _config_file(args.config).items():
        if not isinstance(fields, dict):
            raise ValueError(f"--config: {part} must be an object of fields")
        values[part].update(fields)
    for option, (part, field, _, _) in OPTIONS.items():
        if getattr(args, field_attr(option)) is not None:
            values[part][field] = getattr(args, field_attr(option))
    out = []
    for cls, part in ((Check, "check"), (Paper, "paper")):
        known = {f.name for f in dataclasses.fields(cls)}
        bad = set(values[part]) - known
        if bad:
            raise ValueError(f"{part}: unknown field(s) {sorted(bad)}; allowed: {sorted(known)}")
        fields = {k: tuple(tuple(x) if isinstance(x, list) else x for x in v)
                  if isinstance(v, list) else v for k, v in values[part].items()}
        out.append(cls(**fields))
    return out


def field_attr(option: str) -> str:
    return option[2:].replace("-", "_")


def _peaks_path(args) -> str | None:
    """The peaks.json to read, or None to measure now: study.peaks_file (--peaks, else the
    first default place this kind of machine measured; another machine's file is refused)."""
    from microbench.commands.study import peaks_file

    return peaks_file(args.peaks)


def _peaks(path: str | None, progress) -> dict:
    from microbench.files import read_json

    if path is not None:
        return read_json(path)
    from microbench.roofs import peaks

    progress("this machine's roofs (peaks --quick)")
    return peaks.measure(quick=True, progress=False)


def run(args) -> int:
    from microbench import harness
    from microbench.files import check_writable_dir

    t0 = time.perf_counter()
    bad = set(args.parts) - set(PARTS)
    if bad or not args.parts:
        raise ValueError(f"--parts {','.join(args.parts)}: choose among {PARTS}")
    check, paper = setups(args)
    check.check()
    paper.check()
    peaks_path = _peaks_path(args) if "check" in args.parts else None
    check_writable_dir(args.out)
    result = {"kind": "simulate", "environment": harness.environment()}
    with progress_bar("simulate") as progress:
        if "check" in args.parts:
            from microbench.studies.simulate import validate

            result["check"] = validate(check, _peaks(peaks_path, progress), progress)
            result["check"]["peaks_source"] = peaks_path or "measured now (peaks --quick)"
        if "paper" in args.parts:
            from microbench.studies.scale import study

            result["paper"] = study(paper, progress)
    result["wall_s"] = time.perf_counter() - t0
    return finish("simulate", result, args.out, t0, plot=not args.no_plot, keep_copy=True)
