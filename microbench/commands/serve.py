"""`serve`: the serving engine under a seeded chat trace: SLOs from one reference, the measured
saturation, policies x rates (steady-state goodput and attainment), prefix caching at a
matched unsaturated rate, pool size, the engine's decode step against `Phases`, and
transformers' static batches (peers)."""

from __future__ import annotations

import time

from microbench.commands.study import add_output, finish, floats, names, progress_bar

QUICK = dict(model="tiny", slo_model="tiny", requests=24, system_len=32, length_scale=0.0625,
             page_size=8, token_budget=32, max_running=4, policies=("mixed", "static"),
             rate_fractions=(0.5, 1.5), prefix_requests=16, pool_fractions=(0.5,),
             decode_batch=4, decode_context=127, decode_steps=20, decode_rounds=2)


# option -> (Setup field, parser, help): every size option defaults to None, meaning "the
# Setup's default, or QUICK's with --quick"; an option given explicitly wins over both.
OPTIONS = {
    "--model": ("model", str, "preset to run"),
    "--attention": ("attention", str, "override the preset's attention kind"),
    "--workload": ("workload", str, "trace shape: sharegpt (a system prompt, then ShareGPT's "
                   "lengths x --length-scale), shared, random, few-shot, chat (multi-turn)"),
    "--requests": ("requests", int, "requests per run of the policy sweep"),
    "--system-len": ("system_len", int, "shared prefix tokens (system prompt, few-shot)"),
    "--length-scale": ("length_scale", float, "x ShareGPT's mean prompt and output lengths "
                       "(161.31, 337.99 tokens) and vLLM's length filter"),
    "--prompt-len": ("prompt_len", float, "mean own prompt tokens (not for sharegpt)"),
    "--output-len": ("output_len", float, "mean output tokens (not for sharegpt)"),
    "--spread": ("spread", float, "sigma of the log of the lengths (lognormal)"),
    "--page-size": ("page_size", int, "tokens per KV page"),
    "--token-budget": ("token_budget", int, "tokens per engine step (decodes + chunks)"),
    "--max-running": ("max_running", int, "sequences in the running batch at most"),
    "--policies": ("policies", names, "comma list of mixed, prefill-first, decode-first, "
                   "static"),
    "--rates": ("rates", floats, "comma list of request rates (requests/s); "
                "default: --rate-fractions of the measured saturation"),
    "--rate-fractions": ("rate_fractions", floats,
                         "rates as fractions of the measured saturation (mixed policy, every "
                         "request queued at once)"),
    "--trim": ("trim", float, "steady-state window: the fraction of arrivals left out at "
               "each end"),
    "--slo-scale": ("slo_scale", float, "SLOs = this x the reference request's unloaded TTFT "
                    "and TPOT"),
    "--slo-model": ("slo_model", str, "preset whose unloaded latency the SLOs are scaled "
                    "from (the same SLOs for every policy and served model)"),
    "--attainment-target": ("attainment_target", float, "SLO attainment a rate must keep "
                            "to count as sustained"),
    "--prefix-load": ("prefix_load", float, "prefix cache on/off pair's rate, x the "
                      "cache-off saturation"),
    "--prefix-requests": ("prefix_requests", int, "requests of the prefix cache pair"),
    "--pool-rate-fraction": ("pool_rate_fraction", float, "pool runs at the swept rate "
                             "nearest this fraction of saturation"),
    "--pool-fractions": ("pool_fractions", floats,
                         "pool sizes as fractions of one that holds every running sequence"),
    "--decode-batch": ("decode_batch", int, "rows of the decode-step comparison"),
    "--decode-context": ("decode_context", int, "context of the decode-step comparison"),
    "--decode-steps": ("decode_steps", int, "decode steps timed per round of it"),
    "--decode-rounds": ("decode_rounds", int, "rounds of it (the ratio is their median)"),
    "--peer-rates": ("peer_rates", int, "transformers' static batches at this many of the "
                     "lowest swept rates"),
    "--peer-requests": ("peer_requests", int, "transformers' static batches on this many of "
                        "each trace's first requests"),
    "--seed": ("seed", int, "trace and weights seed"),
}


def add_args(p) -> None:
    from microbench.studies.serve import Setup

    d = Setup()
    for option, (field, kind, text) in OPTIONS.items():
        default = getattr(d, field)
        shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
        p.add_argument(option, type=kind, default=None,
                       help=f"{text} (default {shown}; --quick: {QUICK.get(field, shown)})")
    p.add_argument("--no-peer", action="store_true",
                   help="skip transformers' static batches (needs the peers extra anyway)")
    p.add_argument("--quick", action="store_true",
                   help="the tiny model, 2 policies, 2 rates, 24 requests: about a minute")
    add_output(p, "results/serve")


def setup_of(args):
    from microbench.studies.serve import Setup

    values = dict(QUICK) if args.quick else {}
    for field, _, _ in OPTIONS.values():
        if getattr(args, field) is not None:
            values[field] = getattr(args, field)
    return Setup(**values, peer=not args.no_peer)


def run(args) -> int:
    from microbench import harness
    from microbench.files import check_writable_dir
    from microbench.studies.serve import config, measure

    t0 = time.perf_counter()
    setup = setup_of(args)
    setup.check()
    config(setup)  # an unknown preset or kind fails here, before anything is measured
    check_writable_dir(args.out)
    # the SLO reference, 3 saturations, the sweep, the prefix pair, the pools, decode x 2
    parts = len(setup.policies) * len(setup.rates or setup.rate_fractions) + \
        len(setup.pool_fractions) + 8 + setup.peer
    with progress_bar("serve", parts) as progress:
        result = measure(setup, progress)
    result["environment"] = harness.environment()
    return finish("serve", result, args.out, t0, plot=not args.no_plot)
