"""The explorer page in a real browser (Debian's chromium, driven by Playwright), served from
127.0.0.1 only, its numbers against `refmodel.costs` and `microbench` computed here.

Checks: no console error, no failed request, no request to another host; controls set to
random values (seeded; batches and contexts mostly between grid points) and every displayed
count (FLOPs, bytes, KV per token, the batch that fits, TTFT and TPOT bounds, the binding roof)
equal to `phase_costs` at the batch and context the page says it counted at, which must be the
asked batch for a dense model and the nearest grid point otherwise; switching the chip puts
the roof's ridge at that chip's peak / bandwidth; a measured point's tooltip names its machine
and the date of its result file; the Llama 3 8B / H100 question answered as notebook 03
answers it. Screenshots: build/book/screenshots/explorer-*.png.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import urllib.parse

import test_book as book  # book/test_book.py: the browser, the server, the paths

ROOT, HTML, SHOTS = book.ROOT, book.HTML, book.SHOTS
DTYPES = ("float32", "bfloat16", "float8", "int8", "int4")  # the page's formats
CONTEXTS = tuple(2**i for i in range(6, 18))
BATCHES = tuple(2**i for i in range(11))
MEASURED = ROOT / "figures" / "data"
# The page's state, as explorer.js leaves it in the table's data attributes.
READ = """() => { const v = id => document.getElementById(id).dataset;
  return { batch: +v('x-at').batch, context: +v('x-at').context, flops: +v('x-flops').value,
    bytes: +v('x-bytes').value, ridge: +v('x-ridge').value, compute: +v('x-compute').value,
    memory: +v('x-memory').value, bound: v('x-bound').value, kv: +v('x-kv-token').value,
    fit: v('x-fit').value, ttft: +v('x-ttft').value, tpot: +v('x-tpot').value,
    ridge_batch: v('x-ridge-batch').value,
    roof: document.getElementById('explorer-chart').data.find(d => d.meta === 'roof') }; }"""


def config(key: str):
    from microbench.phases import sweeps
    from refmodel import presets

    if " · " not in key:
        return presets.get(key)
    model, variant = key.split(" · ")
    return dataclasses.replace(presets.get(model), **sweeps.variants()[variant])


def snap(grid, v):
    return min(grid, key=lambda g: abs(math.log(g / v)))


def spec(chip: str, dtype: str) -> tuple[float, float, float | None]:
    """(compute roof, memory roof, memory bytes) of a spec chip, as roofline.spec_roofs."""
    from microbench import hardware, roofline

    dev = hardware.get(chip)
    compute, memory = roofline.spec_roofs(dev, dtype)
    return compute["value"], memory["value"], dev.memory_bytes


def bound(flops, nbytes, c, m):
    tc, tm = flops / c, nbytes / m
    return max(tc, tm), "compute" if tc >= tm else "memory"


def expected(key, phase, batch, context, w, kv, chip):
    """What the page must show, from refmodel.costs and the chip's spec roofs."""
    from refmodel import costs, counting

    cfg = config(key)
    c, m, mem = spec(chip, w)
    def count(ph):
        return costs.phase_costs(cfg, ph, batch, 0 if ph == "decode_ffn" else context,
                                 weight_dtype=w, kv_dtype=kv, count="engine")
    here, pre, dec = count(phase), count("prefill"), count("decode")
    weights = costs.param_counts(cfg)["total"] * counting.BYTES[w]
    seq = costs.kv_cache_bytes(cfg, context, 1, kv)
    return {"flops": here["flops"], "bytes": here["bytes"], "ridge": c / m,
            "bound": bound(here["flops"], here["bytes"], c, m)[1],
            "kv": costs.kv_bytes_per_token(cfg, kv),
            "fit": "unknown" if mem is None else str(math.floor((mem - weights) / seq)
                                                     if weights <= mem else 0),
            "ttft": bound(pre["flops"], pre["bytes"], c, m)[0],
            "tpot": bound(dec["flops"], dec["bytes"], c, m)[0]}


def set_controls(page, **values) -> dict:
    for name, value in values.items():
        el = f"#x-{name}"
        if name in ("batch", "context"):
            page.fill(el, str(value))
            page.dispatch_event(el, "change")
        else:
            page.select_option(el, value)
    return page.evaluate(READ)


def close(a, b, rel=1e-9):
    return math.isclose(a, b, rel_tol=rel)


def check_random(page, rng, problems):
    """Random controls, the page's numbers against refmodel.costs computed here."""
    from microbench import hardware

    chips = [n for n in hardware.list_devices() if n != "cpu"]
    models = ["llama3-8b", "mixtral-8x7b", "gemma2-9b", "deepseek-v2-lite", "bench · sliding",
              "nemotron-h-8b", "qwen3-30b-a3b"]
    for i in range(6):
        key, chip = rng.choice(models), rng.choice(chips)
        phase = rng.choice(["prefill", "decode_attention", "decode_ffn", "decode"])
        batch, context = rng.randint(1, 1024), rng.randint(64, 131072)
        w, kv = rng.choice(DTYPES), rng.choice(DTYPES)
        got = set_controls(page, model=key, chip=f"spec:{chip}", phase=phase, batch=batch,
                           context=context, weight=w, kv=kv)
        moe = "moe" in config(key).layer_ffns
        want_b = snap(BATCHES, batch) if moe else batch
        if (got["batch"], got["context"]) != (want_b, snap(CONTEXTS, context)):
            problems.append(f"{key}: asked B={batch} S={context}, counted at "
                            f"B={got['batch']} S={got['context']}")
            continue
        want = expected(key, phase, got["batch"], got["context"], w, kv, chip)
        for field in ("flops", "bytes", "ridge", "kv", "ttft", "tpot"):
            if not close(got[field], want[field]):
                problems.append(f"{key} {phase} B={batch} S={context} {w}/{kv} on {chip}: "
                                f"{field} {got[field]!r} != {want[field]!r}")
        for field in ("bound", "fit"):
            if got[field] != want[field]:
                problems.append(f"{key} {phase} on {chip}: {field} {got[field]!r} != "
                                f"{want[field]!r}")
        page.evaluate("document.activeElement.blur()")
        page.screenshot(path=str(SHOTS / f"explorer-random-{i}.png"), full_page=True)


def check_ridge_moves(page, problems):
    for chip in ("H100 SXM", "TPU v5e", "MI300X"):
        got = set_controls(page, chip=f"spec:{chip}", weight="bfloat16")
        c, m, _ = spec(chip, "bfloat16")
        knee = list(zip(got["roof"]["x"], got["roof"]["y"], strict=True))[1]
        if not (close(got["ridge"], c / m) and close(knee[0], c / m) and close(knee[1], c)):
            problems.append(f"{chip}: ridge {got['ridge']}, roof knee {knee}; want {c / m} "
                            f"at {c}")


def notebook_03(cfg, roofs) -> int | None:
    """Notebook 03's number: the first power of two at which the decode FFN is compute-bound
    (microbench.phases.sweeps.step_time on a spec chip; the same count on measured roofs)."""
    from microbench.phases import sweeps
    from refmodel import costs

    for b in sweeps.POWERS_OF_TWO:
        c = costs.phase_costs(cfg, "decode_ffn", b, 0, weight_dtype="bfloat16",
                              kv_dtype="bfloat16", act_dtype="bfloat16", count="engine")
        if bound(c["flops"], c["bytes"], *roofs)[1] == "compute":
            return b
    return None


def check_question(page, problems):
    from microbench import hardware, roofline
    from microbench.phases import sweeps

    cfg = config("llama3-8b")
    h100 = hardware.get("H100 SXM")
    nb03 = next((b for b in sweeps.POWERS_OF_TWO if sweeps.step_time(
        cfg, h100, "decode_ffn", b, 0)["bound"] == "compute"), None)
    got = set_controls(page, model="llama3-8b", chip="spec:H100 SXM", phase="decode_ffn",
                       batch=1, context=1024, weight="bfloat16", kv="bfloat16")
    page.evaluate("document.activeElement.blur()")
    page.screenshot(path=str(SHOTS / "explorer-llama3-8b-h100.png"), full_page=True)
    if got["ridge_batch"] != str(nb03) or nb03 != notebook_03(cfg, (
            h100.peak_flops["bfloat16"], h100.memory_bandwidth["HBM"])):
        problems.append(f"H100: the page says {got['ridge_batch']}, notebook 03 {nb03}")
    for folder in sorted(p for p in MEASURED.iterdir() if (p / "peaks.json").exists()):
        roofs = json.loads((folder / "peaks.json").read_text())["roofs"]
        mine = (roofline.compute_roof(roofs, "bfloat16")["value"],
                roofline.main_roof(roofs["memory"], roofline.READ)["value"])
        got = set_controls(page, chip=f"measured:{folder.name}")
        want = notebook_03(cfg, mine)
        if got["ridge_batch"] != str(want if want is not None else "none"):
            problems.append(f"{folder.name}: the page says {got['ridge_batch']}, want {want}")


def check_tooltip(page, problems):
    from microbench import machines

    folder = next(p for p in sorted(MEASURED.iterdir()) if (p / "phases.json").exists())
    env = json.loads((folder / "phases.json").read_text())["environment"]
    set_controls(page, model="bench · gqa", chip=f"measured:{folder.name}",
                 phase="decode_ffn", weight="float32", kv="float32", batch=8)
    page.locator("#explorer-chart").scroll_into_view_if_needed()
    xy = page.evaluate("""() => { const gd = document.getElementById('explorer-chart');
      const i = gd.data.findIndex(d => d.meta === 'measured'); if (i < 0) return null;
      const fl = gd._fullLayout, xa = fl.xaxis, ya = fl.yaxis, r = gd.getBoundingClientRect();
      const p = gd.data[i];
      return [r.left + xa._offset + xa.l2p(Math.log10(p.x[0])),
              r.top + ya._offset + ya.l2p(Math.log10(p.y[0]))]; }""")
    if xy is None:
        problems.append("no measured point drawn for bench · gqa decode FFN")
        return
    page.mouse.move(*xy)
    page.wait_for_selector(".hoverlayer .hovertext", timeout=5000)
    text = page.text_content(".hoverlayer") or ""  # SVG: its text, the lines joined
    page.screenshot(path=str(SHOTS / "explorer-measured-tooltip.png"), full_page=True)
    for want in (machines.describe(env), env["date_utc"]):
        if want not in text:
            problems.append(f"tooltip {text!r} does not name {want!r}")


def test_explorer(capsys):
    sync_playwright = book.browser_or_skip()
    env = {k: v for k, v in os.environ.items() if k != "LAB_FULL"}
    build = subprocess.run([sys.executable, str(ROOT / "book" / "build.py"), "--quiet",
                            "--any-xla-flags"], cwd=ROOT, env=env, capture_output=True,
                           text=True)
    assert build.returncode == 0, f"book/build.py failed:\n{build.stderr[-6000:]}"
    SHOTS.mkdir(parents=True, exist_ok=True)
    problems: list[str] = []
    seen = {"console": [], "failed": [], "external": []}
    server = book.serve(HTML)
    host = f"127.0.0.1:{server.server_address[1]}"
    try:
        with sync_playwright() as p, tempfile.TemporaryDirectory(prefix="lab-explorer-") as d:
            ctx = p.chromium.launch_persistent_context(
                d, executable_path=str(book.CHROMIUM), args=book.ARGS, headless=True,
                viewport={"width": 1280, "height": 1000})
            ctx.set_default_timeout(30_000)
            ctx.route(lambda url: urllib.parse.urlsplit(url).netloc != host,
                      lambda route: (seen["external"].append(route.request.url),
                                     route.abort()))  # the network is off
            page = ctx.new_page()
            page.on("console", lambda m: m.type == "error" and seen["console"].append(m.text))
            page.on("pageerror", lambda e: seen["console"].append(str(e)))
            page.on("requestfailed", lambda r: seen["failed"].append(r.url))
            page.on("response", lambda r: r.status >= 400 and seen["failed"].append(r.url))
            page.goto(f"http://{host}/explorer.html", wait_until="load")
            page.wait_for_selector("#explorer[data-ready='1']")
            check_random(page, random.Random(51), problems)
            check_ridge_moves(page, problems)
            check_question(page, problems)
            check_tooltip(page, problems)
            ctx.close()
    finally:
        server.shutdown()
        server.server_close()
    problems += [f"{kind}: {x}" for kind, xs in seen.items() for x in xs]
    with capsys.disabled():
        print(f"\nexplorer: {len(problems)} problems; console errors {len(seen['console'])}, "
              f"requests to other hosts {len(seen['external'])}; screenshots in "
              f"{SHOTS.relative_to(ROOT)}/explorer-*.png")
    assert not problems, "\n".join(problems[:30])
