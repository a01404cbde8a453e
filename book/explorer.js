// The explorer page (book/explorer_page.py): reads the controls, sums the counts that
// book/explorer.py precomputed from refmodel.costs (window.EXPLORER_DATA), puts the phase on
// the chosen chip's roofs and redraws the Plotly chart the page was built with.
(function () {
  "use strict";
  const D = window.EXPLORER_DATA;
  const $ = (id) => document.getElementById(id);
  const PARTS = { decode: ["decode_attention", "decode_ffn"] };  // a step's two halves

  // ---- the counts: the same sums as explorer.phase_at -------------------------------------
  const add = (a, b) => (Array.isArray(a) ? a.map((x, i) => x + b[i]) : a + b);
  function at(coeffs, n) {  // an affine count [f(1), slope] at n
    const out = {};
    for (const key in coeffs) {
      const [c0, c1] = coeffs[key];
      out[key] = Array.isArray(c0) ? c0.map((x, i) => x + (n - 1) * c1[i]) : c0 + (n - 1) * c1;
    }
    return out;
  }
  function sum(...parts) {
    const out = Object.assign({}, parts[0]);
    for (const p of parts.slice(1)) for (const key in out) out[key] = add(out[key], p[key]);
    return out;
  }
  function ffn(m, tokens) {
    return m.ffn.affine ? at(m.ffn.v, tokens) : m.ffn.v[D.tokens.indexOf(tokens)];
  }
  function phaseAt(m, phase, batch, context) {
    if (phase === "decode_ffn") return ffn(m, batch);
    const i = D.contexts.indexOf(context);
    if (phase === "decode_attention") return at(m.att[i], batch);
    if (phase === "decode") return sum(at(m.att[i], batch), ffn(m, batch), at(m.ends, batch));
    const t = batch * context;
    return sum(at(m.mix[i], batch), ffn(m, t), at(m.ends, t));
  }
  function totals(c, wi, ki) {  // {f, a, w[], k[]} in one weight and one KV format
    const weight = c.w[wi], kv = c.k[ki];
    return { flops: c.f, weight, kv, act: c.a, bytes: weight + kv + c.a };
  }

  // ---- snapping: contexts always, an MoE model's batch ------------------------------------
  function nearestLog(grid, v) {
    let best = grid[0];
    for (const g of grid) if (Math.abs(Math.log(g / v)) < Math.abs(Math.log(best / v))) best = g;
    return best;
  }
  function clampInt(v, lo, hi) {
    const n = Math.round(Number(v));
    return Number.isFinite(n) ? Math.min(hi, Math.max(lo, n)) : lo;
  }

  // ---- the roofs ----------------------------------------------------------------------------
  function roofs(chip, wi) {
    return { C: chip.compute[wi].value, M: chip.memory.value,
             cname: chip.compute[wi].name, mname: chip.memory.name };
  }
  function timing(t, r) {  // microbench.roofline.predict without ops or floor
    const tc = t.flops / r.C, tm = t.bytes / r.M;
    return { time: Math.max(tc, tm), tc, tm, bound: tc >= tm ? "compute" : "memory" };
  }

  // ---- numbers as the table shows them -------------------------------------------------------
  function si(v, unit) {
    if (v === null || v === undefined || !Number.isFinite(v)) return "n/a";
    const p = [[1e18, "E"], [1e15, "P"], [1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]];
    for (const [s, name] of p) if (Math.abs(v) >= s) return `${(v / s).toPrecision(3)} ${name}${unit}`;
    return `${Number(v.toPrecision(3))} ${unit}`;
  }
  function secs(s) {
    if (s >= 1) return `${s.toPrecision(3)} s`;
    if (s >= 1e-3) return `${(s * 1e3).toPrecision(3)} ms`;
    return `${(s * 1e6).toPrecision(3)} µs`;
  }
  function show(id, text, value) {
    const el = $(id);
    el.textContent = text;
    if (value === undefined) el.removeAttribute("data-value");
    else el.dataset.value = String(value);
  }

  // ---- the controls ----------------------------------------------------------------------------
  function fill(id, items, chosen) {
    const el = $(id);
    for (const [value, label, group] of items) {
      const o = new Option(label, value, false, value === chosen);
      (group ? groupOf(el, group) : el).appendChild(o);
    }
  }
  function groupOf(select, label) {
    let g = Array.from(select.children).find((c) => c.label === label);
    if (!g) { g = document.createElement("optgroup"); g.label = label; select.appendChild(g); }
    return g;
  }
  function state() {
    const model = D.models[$("x-model").value], chip = D.chips.find((c) => c.id === $("x-chip").value);
    const wi = D.dtypes.indexOf($("x-weight").value), ki = D.dtypes.indexOf($("x-kv").value);
    const asked = clampInt($("x-batch").value, 1, D.batch_max);
    const batch = model.ffn.affine ? asked : nearestLog(D.batches, asked);
    const context = nearestLog(D.contexts, Number($("x-context").value) || D.contexts[0]);
    return { key: $("x-model").value, model, chip, phase: $("x-phase").value, wi, ki, asked,
             batch, context, askedContext: Number($("x-context").value) };
  }

  // ---- the table ---------------------------------------------------------------------------------
  function computeBoundFrom(s, r) {
    // The first power of two whose counts are compute-bound (as notebook 03 scans them), and
    // for a dense model the first batch of all.
    let pow2 = null, exact = null;
    for (const b of D.batches) {
      if (timing(totals(phaseAt(s.model, s.phase, b, s.context), s.wi, s.ki), r).bound === "compute") { pow2 = b; break; }
    }
    if (s.model.ffn.affine) {
      for (let b = 1; b <= D.batch_max; b++) {
        if (timing(totals(phaseAt(s.model, s.phase, b, s.context), s.wi, s.ki), r).bound === "compute") { exact = b; break; }
      }
    }
    return { pow2, exact };
  }
  function table(s, t, r, tm) {
    const ridge = r.C / r.M;
    show("x-at", `batch ${s.batch}${s.batch !== s.asked ? ` (asked ${s.asked}: an MoE model is counted at powers of two)` : ""}, ` +
         `context ${s.context}${s.context !== s.askedContext ? ` (asked ${s.askedContext}: snapped to a power of two)` : ""}` +
         `${s.phase === "decode_ffn" ? " (decode FFN does not read the cache)" : ""}; ` +
         `weights ${D.dtypes[s.wi]}, KV ${D.dtypes[s.ki]}, activations ${s.model.act_dtype}`);
    $("x-at").dataset.batch = s.batch; $("x-at").dataset.context = s.context;
    show("x-flops", si(t.flops, "FLOP"), t.flops);
    show("x-bytes", `${si(t.bytes, "B")} = weights ${si(t.weight, "B")} + KV ${si(t.kv, "B")} + activations ${si(t.act, "B")}`, t.bytes);
    show("x-intensity", `${(t.flops / t.bytes).toPrecision(4)} FLOP/B`, t.flops / t.bytes);
    show("x-compute", `${si(r.C, "FLOP/s")} (${r.cname})`, r.C);
    show("x-memory", `${si(r.M, "B/s")} (${r.mname})`, r.M);
    show("x-ridge", `${ridge.toPrecision(4)} FLOP/B`, ridge);
    show("x-bound", `${tm.bound}-bound: FLOPs / compute roof = ${secs(tm.tc)}, bytes / memory roof = ` +
         `${secs(tm.tm)}; intensity ${(t.flops / t.bytes).toPrecision(4)} ${tm.bound === "compute" ? ">=" : "<"} ridge ${ridge.toPrecision(4)}`, tm.bound);
    const cb = computeBoundFrom(s, r);
    show("x-ridge-batch", cb.pow2 === null ? `no power of two up to ${D.batch_max}` :
         `${cb.pow2} (first power of two)` + (cb.exact !== null ? `; exactly from batch ${cb.exact}` : ""),
         cb.pow2 === null ? "none" : cb.pow2);
    $("x-ridge-batch").dataset.exact = cb.exact === null ? "none" : cb.exact;
    const perToken = s.model.kv_per_token[s.ki];
    show("x-kv-token", `${si(perToken, "B")} per token per sequence (${D.dtypes[s.ki]})`, perToken);
    fitRow(s, r);
    const ttft = timing(totals(phaseAt(s.model, "prefill", s.batch, s.context), s.wi, s.ki), r);
    const tpot = timing(totals(phaseAt(s.model, "decode", s.batch, s.context), s.wi, s.ki), r);
    show("x-ttft", `${secs(ttft.time)} (prefill of ${s.batch} x ${s.context} tokens, ${ttft.bound}-bound)`, ttft.time);
    show("x-tpot", `${secs(tpot.time)} (one decode step of ${s.batch} sequences at ${s.context}, ${tpot.bound}-bound)`, tpot.time);
    show("x-model-source", `${s.key}: ${si(s.model.params, "")} parameters. ${s.model.source}`);
  }
  function fitRow(s) {
    const mem = s.chip.memory_bytes, weights = s.model.weights[s.wi];
    const seq = s.model.kv_seq[s.ki][D.contexts.indexOf(s.context)];
    if (!mem) { show("x-fit", "memory size not known", "unknown"); return; }
    const fit = weights > mem ? 0 : Math.floor((mem - weights) / seq);
    show("x-fit", `${fit} sequences at context ${s.context}: weights ${si(weights, "B")} + ${fit} x ` +
         `${si(seq, "B")} of KV cache <= ${si(mem, "B")}` + (weights > mem ? " (the weights alone do not fit)" : ""), fit);
  }

  // ---- the chart -------------------------------------------------------------------------------------
  function roofTrace(C, M, name, dash, lo, hi) {
    const ridge = C / M;
    return { x: [lo, ridge, hi], y: [lo * M, C, C], mode: "lines", name,
             line: { dash, color: dash === "dash" ? "#7f7f7f" : "#1f77b4", width: 2 },
             hovertemplate: `${name}<br>ridge %{x:.3g} FLOP/B<extra></extra>`, meta: "roof" };
  }
  function pointOf(s, phase, r, batch) {
    const t = totals(phaseAt(s.model, phase, batch, s.context), s.wi, s.ki);
    const I = t.flops / t.bytes;
    return { I, y: Math.min(r.C, I * r.M), t };
  }
  function traces(s, r) {
    const own = [s.phase, ...(PARTS[s.phase] || [])].map((ph) => ({ ph, ...pointOf(s, ph, r, s.batch) }));
    const sweep = D.batches.map((b) => pointOf(s, s.phase, r, b));
    const measured = (s.chip.points || []).filter((p) => p.models.includes(s.key) && p.phase === s.phase);
    const xs = own.map((p) => p.I).concat(sweep.map((p) => p.I), measured.map((p) => p.intensity), [r.C / r.M]);
    const lo = Math.min(...xs) / 4, hi = Math.max(...xs) * 4;
    const out = [roofTrace(r.C, r.M, `roof: ${r.cname} / ${r.mname}`, s.chip.kind === "spec" ? "dash" : "solid", lo, hi)];
    const spec = s.chip.spec_peaks ? s.chip.spec_peaks[s.wi] : null;
    if (spec) out.push({ x: [lo, hi], y: [spec, spec], mode: "lines", name: `spec peak ${D.dtypes[s.wi]} (derived)`,
                         line: { dash: "dash", color: "#7f7f7f" }, hoverinfo: "name" });
    out.push({ x: sweep.map((p) => p.I), y: sweep.map((p) => p.y), mode: "lines+markers", name: `${D.phases[s.phase]}, batch 1..${D.batch_max}`,
               line: { color: "#ff7f0e", width: 1 }, marker: { size: 6, color: "#ff7f0e" },
               text: D.batches.map((b) => `batch ${b}`), hovertemplate: "%{text}<br>%{x:.3g} FLOP/B<extra></extra>" });
    out.push({ x: own.map((p) => p.I), y: own.map((p) => p.y), mode: "markers+text", name: "counted (this batch and context)",
               text: own.map((p) => p.ph.replace("_", " ")), textposition: "top center",
               marker: { size: own.map((_, i) => (i === 0 ? 14 : 9)), color: "#d62728", symbol: "diamond" },
               hovertemplate: "%{text}<br>%{x:.3g} FLOP/B, %{y:.3s}FLOP/s attainable<extra></extra>" });
    if (measured.length) {
      out.push({ x: measured.map((p) => p.intensity), y: measured.map((p) => p.flops_per_s), mode: "markers",
                 name: `measured (${s.chip.machine})`, marker: { size: 10, color: "#2ca02c" },
                 hovertext: measured.map((p) => `measured on ${p.machine}<br>${p.date}<br>${p.variant}, ${p.phase}, ` +
                   `batch ${p.batch}, context ${p.context}, ${p.dtype}<br>measured / predicted ${p.ratio === null ? "n/a" : p.ratio.toFixed(2)}` +
                   (p.suspect ? " (flagged suspect)" : "")), hoverinfo: "text", meta: "measured" });
    }
    return { data: out, lo, hi };
  }
  function update() {
    const s = state(), r = roofs(s.chip, s.wi);
    const t = totals(phaseAt(s.model, s.phase, s.batch, s.context), s.wi, s.ki);
    table(s, t, r, timing(t, r));
    const gd = $("explorer-chart"), tr = traces(s, r);
    const ys = tr.data.flatMap((d) => d.y).filter((y) => y > 0);
    const layout = Object.assign({}, gd.layout, {
      xaxis: Object.assign({}, gd.layout.xaxis, { range: [Math.log10(tr.lo), Math.log10(tr.hi)], autorange: false }),
      yaxis: Object.assign({}, gd.layout.yaxis, { range: [Math.log10(Math.min(...ys) / 3), Math.log10(Math.max(...ys) * 2)], autorange: false }),
      title: { text: `${s.key} on ${s.chip.label}: ${D.phases[s.phase]}`, font: { size: 14 } } });
    Plotly.react(gd, tr.data, layout);
  }

  function init() {
    const models = Object.keys(D.models);
    fill("x-model", models.map((k) => [k, k, k.includes(" · ") ? "the measured model's variants" : "presets"]), "llama3-8b");
    fill("x-chip", D.chips.map((c) => [c.id, c.label, c.kind === "spec" ? "spec sheets (dashed)" : "measured (solid)"]), "spec:H100 SXM");
    fill("x-phase", Object.entries(D.phases).map(([k, v]) => [k, v]), "decode_ffn");
    fill("x-weight", D.dtypes.map((d) => [d, d]), "bfloat16");
    fill("x-kv", D.dtypes.map((d) => [d, d]), "bfloat16");
    for (const id of ["x-model", "x-chip", "x-phase", "x-batch", "x-context", "x-weight", "x-kv"]) {
      $(id).addEventListener("input", update);
      $(id).addEventListener("change", update);
    }
    update();
    document.getElementById("explorer").dataset.ready = "1";
  }
  init();
})();
