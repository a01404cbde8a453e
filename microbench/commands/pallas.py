"""`pallas`: refmodel's Pallas kernels timed against their plain-jnp references (XLA's code).

`python -m microbench pallas [--quick] [--platform P] --out DIR` times decode attention over a
contiguous cache and over pages, and the grouped (MoE) matmul, each beside its reference
(refmodel.pallas's reference_* oracles, compiled by XLA), in bfloat16, with the harness
(compile excluded, `block_until_ready`), and writes DIR/pallas.json: per op the two timings,
the reference's time over the kernel's, the largest difference of their outputs and the
counted bytes moved per second. refmodel.pallas is imported only here and only when run: where
it is absent (or an op fails on this platform) the op is listed under `skipped` with why.
On a CPU the kernels run in interpret mode (their logic, not their speed): tiny shapes.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

# B, K, G, H, S (keys), page; R rows, D, F, E experts of the grouped matmul.
SHAPES = {"cpu": dict(B=2, K=2, G=2, H=64, S=64, page=8, R=64, D=64, F=128, E=4),
          "quick": dict(B=8, K=8, G=4, H=128, S=4096, page=16, R=4096, D=2048, F=1024, E=8),
          "full": dict(B=32, K=8, G=4, H=128, S=8192, page=16, R=8192, D=4096, F=2048, E=16)}
KIND = "microbench.pallas"


def add_args(p) -> None:
    p.add_argument("--quick", action="store_true", help="smaller shapes, shorter budgets")
    p.add_argument("--out", default="results/pallas", help="output folder (pallas.json)")
    p.add_argument("--platform", default="auto", help="auto, cpu, gpu or tpu "
                   "(roofs.platform.choose: an accelerator's path is forced on a CPU backend)")


def _inputs(s: dict, seed: int = 0) -> dict:
    """Random normal bfloat16 operands; lengths in [S/2, S]; pages in shuffled order."""
    import jax.numpy as jnp

    rng = np.random.default_rng(seed)

    def normal(*shape):
        return jnp.asarray(rng.standard_normal(shape, dtype=np.float32)).astype(jnp.bfloat16)

    B, K, G, H, S, page = (s[k] for k in ("B", "K", "G", "H", "S", "page"))
    n = S // page
    sizes = rng.multinomial(s["R"] - s["R"] // 8, np.ones(s["E"]) / s["E"])
    return {"q": normal(B, K, G, H), "k": normal(B, K, S, H), "v": normal(B, K, S, H),
            "lens": jnp.asarray(rng.integers(S // 2, S + 1, B), jnp.int32),
            "k_pages": normal(B * n, K, page, H), "v_pages": normal(B * n, K, page, H),
            "tables": jnp.asarray(rng.permutation(B * n).reshape(B, n), jnp.int32),
            "x": normal(s["R"], s["D"]), "w": normal(s["E"], s["D"], s["F"]),
            "sizes": jnp.asarray(sizes, jnp.int32), "scale": float(H) ** -0.5}


def _ops(pallas, a: dict, s: dict) -> dict:
    """{op: (kernel call, reference call, counted bytes, counted FLOPs)}."""
    tokens = int(np.asarray(a["lens"]).sum())
    kv = 2 * tokens * s["K"] * s["H"] * 2  # K and V rows read, bfloat16
    att = 4 * tokens * s["K"] * s["G"] * s["H"]
    rows = int(np.asarray(a["sizes"]).sum())
    gmm_bytes = 2 * (s["E"] * s["D"] * s["F"] + rows * (s["D"] + s["F"]))
    return {
        "decode_attention": (lambda: pallas.decode_attention(a["q"], a["k"], a["v"], a["lens"],
                                                             a["scale"]),
                             lambda: pallas.reference_decode_attention(
                                 a["q"], a["k"], a["v"], a["lens"], a["scale"]), kv, att),
        "paged_attention": (lambda: pallas.paged_attention(
                                a["q"], a["k_pages"], a["v_pages"], a["tables"], a["lens"],
                                a["scale"]),
                            lambda: pallas.reference_paged_attention(
                                a["q"], a["k_pages"], a["v_pages"], a["tables"], a["lens"],
                                a["scale"]), kv, att),
        "grouped_matmul": (lambda: pallas.grouped_matmul(a["x"], a["w"], a["sizes"]),
                           lambda: pallas.reference_grouped_matmul(a["x"], a["w"], a["sizes"]),
                           gmm_bytes, 2 * rows * s["D"] * s["F"]),
    }


def _time(fn, budget_s: float):
    from microbench import harness

    return harness.time_fn(fn, budget_s=budget_s, min_samples=3, target_cv=0.05,
                           min_sample_s=2e-3)


def time_op(name: str, kernel, reference, nbytes: float, flops: float, budget_s: float) -> dict:
    """Both timed, their outputs compared (float32), rates of the kernel's counted work."""
    import jax
    import jax.numpy as jnp

    from microbench import harness

    kernel, reference = jax.jit(kernel), jax.jit(reference)  # compiled once: compared, timed
    out_k, out_r = kernel(), reference()
    err = float(jnp.max(jnp.abs(out_k.astype(jnp.float32) - out_r.astype(jnp.float32))))
    tk, tr = _time(kernel, budget_s), _time(reference, budget_s)
    return {"op": name, "dtype": "bfloat16", "kernel": tk.to_dict(), "reference": tr.to_dict(),
            "reference_over_kernel": tr.median / tk.median, "max_abs_difference": err,
            "bytes": nbytes, "flops": flops, "kernel_bytes_per_s": harness.rates(nbytes, tk),
            "kernel_flops_per_s": harness.rates(flops, tk)}


def measure(platform, quick: bool) -> dict:
    """Every op timed (or skipped, with why) on this platform; the pallas.json object."""
    from microbench.roofs.platform import environment, machine_label

    env = environment(platform)
    shapes = SHAPES["cpu" if platform.backend == "cpu" else "quick" if quick else "full"]
    result = {"kind": KIND, "machine": machine_label(env), "quick": quick, "environment": env,
              "platform": platform.to_dict(), "shapes": shapes, "ops": [], "skipped": []}
    t0 = time.perf_counter()
    try:
        import refmodel.pallas as pallas
    except ImportError as e:
        result["skipped"].append({"what": "every Pallas kernel",
                                  "why": f"refmodel.pallas cannot be imported here ({e})"})
        return {**result, "wall_s": time.perf_counter() - t0}
    a = _inputs(shapes)
    budget = 0.05 if platform.backend == "cpu" else 0.3 if quick else 1.0
    for name, (kernel, reference, nbytes, flops) in _ops(pallas, a, shapes).items():
        try:
            result["ops"].append(time_op(name, kernel, reference, nbytes, flops, budget))
        except Exception as e:  # noqa: BLE001 - a kernel this platform cannot lower
            result["skipped"].append({"what": name, "why": f"{type(e).__name__}: "
                                                         f"{str(e).splitlines()[0][:300]}"})
    return {**result, "wall_s": time.perf_counter() - t0}


def run(args) -> int:
    from microbench.files import check_writable_dir, write_json_atomic
    from microbench.roofs.platform import current

    platform = current(args.platform)
    check_writable_dir(args.out)
    result = measure(platform, args.quick)
    path = write_json_atomic(Path(args.out) / "pallas.json", result)
    for op in result["ops"]:
        print(f"{op['op']}: kernel {op['kernel']['median'] * 1e3:.3f} ms, reference "
              f"{op['reference']['median'] * 1e3:.3f} ms (reference/kernel "
              f"{op['reference_over_kernel']:.2f}), "
              f"{op['kernel_bytes_per_s']['median'] / 1e9:.1f} GB/s counted, max |diff| "
              f"{op['max_abs_difference']:.3g}")
    for s in result["skipped"]:
        print(f"skipped: {s['what']}: {s['why']}")
    print(f"wrote {path}")
    return 0
