"""`python -m refmodel ...`: the presets and their analytic costs from the command line.

    python -m refmodel presets                       # name, total, active, KV bytes/token
    python -m refmodel costs --preset llama3-8b --batch 8 --context 4096 [--json]
        [--weight-dtype bfloat16] [--kv-dtype bfloat16] [--act-dtype bfloat16]
    python -m refmodel costs --check [--kinds gqa mla]   # the compiler cross-check table

Numbers come from `refmodel.costs` (see its docstring for what each phase counts) and the
cross-check from `refmodel.compiler_check`. A bad argument exits with status 2 and a message naming
the field and the allowed values, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys

from refmodel import costs, presets
from refmodel.counting import BYTES
from refmodel.phases import PHASES


def _si(x: float) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.2f}{unit}"
    return f"{x:.0f}"


def presets_table() -> str:
    head = f"{'preset':20s} {'total':>17s} {'active':>17s} {'KV B/token (bf16)':>18s}  source"
    lines = [head, "-" * len(head)]
    for name in presets.names():
        cfg = presets.get(name)
        p = costs.param_counts(cfg)
        src = presets.source(name)
        lines.append(f"{name:20s} {p['total']:>17,} {p['active']:>17,} "
                     f"{costs.kv_bytes_per_token(cfg):>18,.0f}  {src[:60]}")
    return "\n".join(lines)


def costs_report(name: str, batch: int, context: int, weight_dtype=None, kv_dtype=None,
                 act_dtype=None, phases=PHASES, count: str = "engine") -> dict:
    """The JSON object of `costs --json`. Real presets are counted as an engine runs them by
    default (`count`, see refmodel.costs.COUNTS)."""
    cfg = presets.get(name)
    p = costs.param_counts(cfg)
    return {
        "preset": name, "source": presets.source(name), "batch": batch, "context": context,
        "count": count,
        "params_total": p["total"], "params_active": p["active"],
        "params_active_without_embedding": p["active_without_embedding"],
        "params_non_embedding": p["non_embedding"], "params_components": p["components"],
        "kv_bytes_per_token": costs.kv_bytes_per_token(cfg, "bfloat16"),
        "kv_cache_bytes": costs.kv_cache_bytes(cfg, context, batch,
                                               kv_dtype or cfg.dtype),
        "phases": {ph: costs.phase_costs(cfg, ph, batch, context, weight_dtype, kv_dtype,
                                         act_dtype, count=count) for ph in phases},
    }


def costs_table(report: dict) -> str:
    lines = [f"{report['preset']}: {report['params_total']:,} parameters, "
             f"{report['params_active']:,} active; KV cache {_si(report['kv_cache_bytes'])}B "
             f"at batch {report['batch']}, context {report['context']}; "
             f"{report['kv_bytes_per_token']:,.0f} KV bytes/token in bf16"]
    head = (f"  {'op':18s} {'FLOPs':>10s} {'weight B':>10s} {'KV B':>10s} {'act B':>10s} "
            f"{'FLOP/B':>8s}")
    for phase, pc in report["phases"].items():
        dts = pc["dtypes"]
        lines += ["", f"{phase} (weights {dts['weight']}, KV {dts['kv']}, activations "
                      f"{dts['act']})", head]
        for op, c in list(pc["ops"].items()) + [("total", pc)]:
            inten = "-" if c["intensity"] is None else f"{c['intensity']:.1f}"
            lines.append(f"  {op:18s} {_si(c['flops']):>10s} {_si(c['weight_bytes']):>10s} "
                         f"{_si(c['kv_bytes']):>10s} {_si(c['act_bytes']):>10s} {inten:>8s}")
    return "\n".join(lines)


DEFAULT_RECIPES = ("target", "draft", "target-moe")


def train(names: list[str], fresh: bool = False, progress: bool = True) -> list:
    """`python -m refmodel train`: each recipe trained (or resumed) and reported."""
    from refmodel import training  # imports optax and the corpus only when asked

    recipes = [training.recipes.get(n) for n in names]  # unknown names fail before training
    results = []
    for recipe in recipes:
        r = training.train(recipe, resume=not fresh, progress=progress)
        p = costs.param_counts(presets.get(recipe.model))
        print(f"{recipe.name}: {recipe.model}, {p['total']:,} parameters, step {r.step} of "
              f"{recipe.steps} ({recipe.tokens:,} tokens), this run {r.seconds:.0f} s"
              + (f" at {r.tokens_per_s:,.0f} tokens/s" if r.trained_tokens else
                 " (already trained: loaded)")
              + f"; validation {r.val_bpb:.3f} bits/byte; "
              f"checkpoint {r.path}\n  corpus {r.corpus}", flush=True)
        results.append(r)
    return results


def kernels_report() -> tuple[str, int]:
    """Build (or find) the native kernels for this CPU and check them against numpy: the text
    and the exit status (1 when they are not available or a check fails)."""
    import numpy as np

    from refmodel import kernels
    from refmodel.kernels import build

    if not kernels.available():
        return (f"native kernels: not available here: {kernels.why_not()}\n"
                "the model runs on backend='xla'"), 1
    cxx = build.compiler()
    lines = [f"native kernels: {build.library_path(cxx)}",
             f"built by {build._version(cxx)} with {' '.join(build.FLAGS)}"]
    rng = np.random.default_rng(0)
    worst = 0.0
    # x [M, n_in] times w [n_in, n_out]: (M, n_in, n_out)
    for m, k, n in ((1, 1024, 300), (2, 100, 37), (8, 4096, 64), (17, 7, 5)):
        x = rng.standard_normal((m, k)).astype(np.float32)
        w = rng.standard_normal((k, n)).astype(np.float32)
        want = x.astype(np.float64) @ w.astype(np.float64)
        got = np.asarray(kernels.rows(x, kernels.panels(w), n), np.float64)
        worst = max(worst, float(np.abs(got - want).max() / np.abs(want).max()))
    ok = worst < 1e-5
    lines.append(f"rows(x, w) against numpy on 4 shapes (1-17 rows): largest error "
                 f"{worst:.1e} of the largest output: {'ok' if ok else 'FAILED (> 1e-5)'}")
    # the serving engine's page kernels: 3 sequences, 2 KV heads of 4 queries, 16-token pages
    from refmodel.kernels.pages import gather_pages_native, paged_attention
    q = rng.standard_normal((3, 2, 4, 32)).astype(np.float32)
    kv = rng.standard_normal((2, 9, 2, 16, 32)).astype(np.float32)
    tables = rng.integers(0, 9, (3, 4)).astype(np.int32)
    lens = np.array([1, 30, 64], np.int32)
    view = [np.concatenate(list(p[tables].transpose(1, 0, 2, 3, 4)), axis=2) for p in kv]
    same = all(np.array_equal(np.asarray(gather_pages_native(p, tables, 2)), v)
               for p, v in zip(kv, view, strict=True))
    got = np.asarray(paged_attention(q, kv[0], kv[1], tables, lens, 0.2), np.float64)
    err = 0.0
    for b in range(3):
        s = 0.2 * np.einsum("kgh,ksh->kgs", q[b], view[0][b, :, :lens[b]], dtype=np.float64)
        p = np.exp(s - s.max(-1, keepdims=True))
        want = np.einsum("kgs,ksh->kgh", p / p.sum(-1, keepdims=True), view[1][b, :, :lens[b]])
        err = max(err, float(np.abs(got[b] - want).max()))
    good = same and err < 1e-5
    lines.append(f"gather_pages and paged_attention against numpy (3 sequences, 1-64 tokens): "
                 f"gather {'exact' if same else 'DIFFERS'}, attention largest error {err:.1e}: "
                 f"{'ok' if good else 'FAILED'}")
    # the integer dot kernel: x rounded to int8 per block, int8 and int4 weights
    import jax.numpy as jnp

    from refmodel import quant
    from refmodel.kernels import qdot
    x = rng.standard_normal((3, 100)).astype(np.float32)
    w = jnp.asarray(rng.standard_normal((100, 70)), jnp.float32)
    qerr = 0.0
    for fmt in ("int8", "int4"):
        q = quant.quantize_matrix(w, fmt, acts=True)
        want = np.asarray(quant.round_activations(jnp.asarray(x)) @ q.dequantize(), np.float64)
        got = np.asarray(jnp.asarray(x) @ qdot.QuantPanels.of_quantized(q), np.float64)
        qerr = max(qerr, float(np.abs(got - want).max() / np.abs(want).max()))
    qok = qerr < 1e-5
    lines.append(f"integer dot (int8 and int4 weights, int8 activations; instruction: "
                 f"{qdot.int8_dot() or 'none, portable integer arithmetic'}) against the "
                 f"dequantized product: largest error {qerr:.1e}: "
                 f"{'ok' if qok else 'FAILED (> 1e-5)'}")
    return "\n".join(lines), 0 if ok and good and qok else 1


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m refmodel", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("presets", help="list the presets: parameters and KV bytes per token")
    sub.add_parser("kernels", help="build the native kernels for this CPU (refmodel.kernels) "
                                   "and check them against numpy, or say why they cannot be")
    t = sub.add_parser("train", help="train byte-level models on the Python standard library "
                                     "(checkpoints cached per user; resumes a stopped run)")
    t.add_argument("--recipe", nargs="+", default=list(DEFAULT_RECIPES),
                   help=f"recipes of refmodel.training.recipes (default: "
                        f"{' '.join(DEFAULT_RECIPES)})")
    t.add_argument("--fresh", action="store_true",
                   help="start from step 0 even if a checkpoint exists")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    c = sub.add_parser("costs", help="analytic FLOPs and bytes per phase and op")
    c.add_argument("--preset", help=f"one of {', '.join(presets.names())}")
    c.add_argument("--batch", type=int, default=1, help="sequences (B), default 1")
    c.add_argument("--context", type=int, default=1024,
                   help="prompt length for prefill, cached tokens for decode (default 1024)")
    for field in ("weight", "kv", "act"):
        c.add_argument(f"--{field}-dtype", default=None,
                       help=f"one of {', '.join(sorted(BYTES))} (default: the preset's dtype)")
    c.add_argument("--phase", nargs="+", default=list(PHASES), help="phases to report")
    c.add_argument("--json", action="store_true", help="print one JSON object")
    c.add_argument("--count", choices=costs.COUNTS, default="engine",
                   help="engine: what a serving engine reads (a sliding window reads min(S, W) "
                        "keys); implementation: what this code runs (its ring reads all W)")
    c.add_argument("--check", action="store_true",
                   help="run the compiler cross-check on the tiny preset instead")
    c.add_argument("--kinds", nargs="+", default=None,
                   help="attention kinds for --check (default: every registered kind)")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    try:
        if args.command == "presets":
            print(presets_table())
        elif args.command == "kernels":
            text, status = kernels_report()
            print(text)
            return status
        elif args.command == "train":
            train(args.recipe, fresh=args.fresh, progress=not args.quiet)
        elif args.check:
            from refmodel import compiler_check  # imports jax compilation machinery only when asked

            rows = compiler_check.run(tuple(args.kinds) if args.kinds else None)
            print(json.dumps(rows, indent=1) if args.json else compiler_check.format_table(rows))
        else:
            if args.preset is None:
                ap.error(f"costs needs --preset (one of {', '.join(presets.names())}) or --check")
            for ph in args.phase:
                if ph not in PHASES:
                    raise ValueError(f"phase={ph!r} is not allowed; choose one of {list(PHASES)}")
            report = costs_report(args.preset, args.batch, args.context, args.weight_dtype,
                                  args.kv_dtype, args.act_dtype, tuple(args.phase),
                                  args.count)
            print(json.dumps(report, indent=1) if args.json else costs_table(report))
    except ValueError as err:
        ap.error(str(err))  # exits with status 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
