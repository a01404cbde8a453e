"""What each format of the decode race costs in quality: how far it moves the next-token
distribution from our float32 model, and how often ours and llama.cpp's pick the same tokens.

KL divergence KL(p_float32 || p_format) = sum_v p(v) (log p(v) - log q(v)) of the next-token
distribution at every position of held-out text (the validation split of the byte-level corpus,
`refmodel.training.data`), read by a model trained here (`refmodel.training.trained`): the mean
over positions, in nats, for our formats (`refmodel.forward` of each program's model) and for
llama.cpp's files of the same trained weights (every position's logits from one evaluation,
`llamacpp.Server(..., logits_all=True)`). Both are measured against the same float32 reference,
ours, so their KLs compare directly.

Greedy agreement: the fraction of the first N greedy tokens that are equal, ours against
llama.cpp's, per pair of formats (decode_formats.PAIRS), from the same prompt. Once one token
differs the two continue from different text, so later tokens mostly differ: read it with
`first_difference`. On the trained model, llama.cpp's servers keep every position's logits, so
the step agreement is measured too: at each of our greedy steps, whether llama.cpp, fed the
same text, picks the same token (`step_agreement`). On the race's random-weight model the
logits are nearly flat (top-2 gaps of a fraction of a logit), so rounding flips the argmax
early; the trained model's KL is the measure of quality, its agreements the check that both
engines compute the same function.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from microbench.studies.decode_formats import (
    OURS,
    PAIRS,
    THEIRS,
    llama_files,
    our_model,
    short,
)


def kl(ref: np.ndarray, other: np.ndarray) -> np.ndarray:
    """KL(softmax(ref) || softmax(other)) in nats over the last axis: logits [..., V] -> [...]."""
    def log_softmax(x):
        x = np.asarray(x, np.float64)
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    lp, lq = log_softmax(ref), log_softmax(other)
    return np.maximum((np.exp(lp) * (lp - lq)).sum(-1), 0.0)  # >= 0 but for float rounding


def agreement(ours, theirs) -> dict:
    """Greedy tokens of two programs from one prompt: the fraction equal, position by position,
    and the first position where they differ (None: all equal)."""
    ours, theirs = [int(t) for t in ours], [int(t) for t in theirs]
    n = min(len(ours), len(theirs))
    if n == 0:
        raise ValueError("agreement needs at least one token from each side")
    equal = [a == b for a, b in zip(ours[:n], theirs[:n], strict=True)]
    return {"ours": ours, "theirs": theirs, "agreement": sum(equal) / n,
            "first_difference": None if all(equal) else equal.index(False)}


def greedy_pairs(ours_tokens: dict, theirs_tokens: dict) -> list[dict]:
    """{pair, ours, theirs, agreement, first_difference, ...} per pair whose sides both ran."""
    return [{"pair": label, "ours_program": ours, "theirs_program": theirs,
             **agreement(ours_tokens[ours], theirs_tokens[theirs])}
            for label, ours, theirs, _ in PAIRS if ours in ours_tokens and theirs in theirs_tokens]


def our_greedy(models: dict, prompt: np.ndarray, n: int) -> dict:
    """{program: its n greedy tokens after `prompt`} (refmodel.generate)."""
    import refmodel

    return {p: np.asarray(refmodel.generate(m, prompt[None], n))[0, len(prompt):].tolist()
            for p, m in models.items()}


def held_out(recipe_name: str, windows: int, length: int) -> np.ndarray:
    """int32 [windows, length]: seeded windows of the validation split of a recipe's corpus."""
    from refmodel.training import data, recipes

    corpus = data.load(max_bytes=recipes.get(recipe_name).max_bytes)
    return data.windows(corpus.val, windows, length, np.random.default_rng(0))[:, :-1]


def _row(side: str, program: str, ref: np.ndarray, logits: np.ndarray, **more) -> dict:
    d = kl(ref, logits)
    return {"side": side, "program": program, "kl_mean": float(d.mean()),
            "kl_max": float(d.max()),
            "top1_agreement": float((ref.argmax(-1) == logits.argmax(-1)).mean()), **more}


def measure_quality(setup, skipped: list, progress=lambda what: None) -> dict:
    """KL per format against our float32 model on held-out text of `setup.quality_model`, and
    greedy agreement per pair from a held-out prompt: {"recipe", "positions", "rows",
    "greedy", "llamacpp"} ("llamacpp": None, or why llama.cpp's side could not run)."""
    import refmodel
    from refmodel.training import trained

    progress(f"quality: the trained {setup.quality_model} model (trained first if missing)")
    model = trained(setup.quality_model, progress=False)
    toks = held_out(setup.quality_model, setup.quality_windows, setup.quality_len)
    ref = np.asarray(refmodel.forward(model, toks))  # [n, T, V]
    prompt = toks[0, :setup.quality_len // 2]
    rows, models = [], {}
    for program, (_, _, what) in OURS.items():
        progress(f"quality: ours {program}")
        try:
            m, backend, _, bits = our_model(model, program)
        except (ValueError, RuntimeError) as e:  # a format not made, or no native kernels
            skipped.append(f"quality, {program}: {short(e)}")
            continue
        models[program] = m
        rows.append(_row("ours", program, ref, np.asarray(refmodel.forward(m, toks)),
                         backend=backend, format=what, matrix_bpw=bits["matrix_bpw"]))
    why = _llama_why(model.cfg, setup.peers)
    greedy = []
    if why is None:  # greedy tokens only where there are llama.cpp's to set them beside
        progress("quality: our greedy tokens")
        paired = {ours for _, ours, _, _ in PAIRS}
        ours_tokens = our_greedy({p: m for p, m in models.items() if p in paired}, prompt,
                                 setup.agree_tokens)
        theirs_tokens, steps = _llama_quality(model, (toks, ref, prompt), ours_tokens, setup,
                                              rows, skipped, progress)
        greedy = [dict(g, step_agreement=steps.get((g["ours_program"], g["theirs_program"])))
                  for g in greedy_pairs(ours_tokens, theirs_tokens)]
    return {"recipe": setup.quality_model, "preset": model.cfg.name,
            "positions": int(toks.size), "windows": int(toks.shape[0]),
            "length": int(toks.shape[1]), "rows": rows, "llamacpp": why,
            "greedy": greedy, "greedy_prompt_len": int(len(prompt))}


def step_agreement(logits: np.ndarray, prompt_len: int, tokens) -> float:
    """The fraction of one program's greedy steps another picks too, fed the same text:
    `logits` [T, V] are the other's over prompt + tokens[:-1]; row prompt_len - 1 + i predicts
    tokens[i]. Unlike the agreement of two free runs, one early difference does not carry
    into every later step."""
    tokens = np.asarray(tokens)
    picks = np.asarray(logits)[prompt_len - 1:prompt_len - 1 + len(tokens)].argmax(-1)
    return float((picks == tokens).mean())


def _llama_why(cfg, peers: bool) -> str | None:
    """Why llama.cpp's side of the quality cannot be measured, or None."""
    from microbench.studies import llamacpp

    if not peers:
        return "the peers were not run (--no-peers or --quick)"
    why = llamacpp.available()
    if why:
        return f"llama.cpp: {why}"
    try:
        llamacpp.check_config(cfg)
    except ValueError as e:
        return f"the trained model cannot be written as a llama GGUF: {e}"
    return None


def _llama_quality(model, text: tuple, ours_tokens: dict, setup, rows: list, skipped: list,
                   progress) -> tuple[dict, dict]:
    """For each of llama.cpp's files of the trained model: its row (appended to `rows`: KL
    against our float32 logits), its greedy tokens and, per pair it is in, its step agreement
    along our greedy tokens. text = (held-out tokens [n, T], our float32 logits, prompt)."""
    from microbench.studies import llamacpp

    toks, ref, prompt = text
    tokens, steps = {}, {}
    with tempfile.TemporaryDirectory(prefix="decode_quality_") as folder:
        progress("quality: llama.cpp quantizes the trained model")
        files = llama_files(model, Path(folder), setup.quality_model, skipped)
        for peer, f in files.items():
            progress(f"quality: {peer}")
            server = llamacpp.Server(f["path"], toks.shape[1], logits_all=True)
            try:
                logits = np.stack([server.sequence_logits(t) for t in toks])
                tokens[peer] = server.greedy(prompt, setup.agree_tokens)
                for _, ours, theirs, _ in PAIRS:
                    if theirs == peer and ours in ours_tokens:
                        along = np.concatenate([prompt, ours_tokens[ours][:-1]])
                        steps[ours, peer] = step_agreement(server.sequence_logits(along),
                                                           len(prompt), ours_tokens[ours])
            finally:
                server.close()
            rows.append(_row("llama.cpp", peer, ref, logits, format=THEIRS[peer] or "F32",
                             matrix_bpw=f["matrix_bpw"], types=f["types"]))
    return tokens, steps
