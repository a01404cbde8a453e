"""The decode race's peers (microbench.studies.decode): llama.cpp, one server per format it
reads (its F32 file of our model and its own quantizations of it: decode_formats), and
Hugging Face transformers when installed (the `peers` extra), each timed at batch 1 in every
round; and the greedy tokens of each pair of formats, ours against llama.cpp's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from microbench.studies.decode_formats import PAIRS, llama_files, short


def report_peer_available() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))


class Peers:
    """llama.cpp's servers, one per format that could be written (`start`), and whether
    transformers runs; `steps` times each at batch 1 in a round."""

    def __init__(self):
        self.servers, self.files, self.hf = {}, {}, False

    def start(self, model, setup, folder: Path, skipped: list, progress) -> None:
        from microbench.studies import llamacpp

        why = llamacpp.available()
        if why:
            skipped.append(f"llama.cpp: {why}")
        else:
            progress("llama.cpp: writing the F32 GGUF and quantizing it")
            self.files = llama_files(model, folder, setup.model, skipped)
            for peer, f in self.files.items():
                try:
                    self.servers[peer] = llamacpp.Server(f["path"], setup.context)
                except RuntimeError as e:  # the child stopped: this file is left out
                    skipped.append(f"{peer}: {short(e)}")
        self.hf = report_peer_available()
        if not self.hf:
            skipped.append("transformers: not installed (pip install -e '.[peers]')")

    def steps(self, entry: dict, i: int, setup, cfg, skipped: list, progress) -> None:
        """The peers' batch-1 steps of round i into entry["peers"] (once transformers fails,
        its reason is in `skipped` and it is not asked again)."""
        from microbench.phases import report

        for name, server in self.servers.items():
            progress(f"round {i + 1}: {name}")
            r = server.round(setup.peer_steps)
            entry["peers"].append({"program": name, "batch": 1,
                                   "weight_bytes": self.files[name]["step_weight_bytes"], **r})
        if not self.hf:
            return
        progress(f"round {i + 1}: transformers")
        r = report.hf_peer(cfg, setup.context, steps=setup.peer_steps)
        if not r.get("step_s"):
            skipped.append(f"transformers: {r.get('error')}")
            self.hf = False
            return
        entry["peers"].append({"program": "transformers", "batch": 1, "step_s": r["step_s"],
                               "samples": r["samples"], "torch": r.get("torch"),
                               "threads": r.get("threads")})

    def close(self) -> None:
        for server in self.servers.values():
            server.close()


def race_greedy(ours, servers: dict, setup, progress) -> list[dict]:
    """Greedy tokens of each pair of formats from one seeded prompt, ours against llama.cpp's."""
    from microbench.studies.decode_quality import greedy_pairs, our_greedy

    progress("greedy tokens, ours and llama.cpp's, per format")
    prompt = np.random.default_rng(0).integers(0, ours.model.cfg.vocab_size, 16)
    theirs = {peer: s.greedy(prompt.tolist(), setup.agree_tokens) for peer, s in servers.items()}
    paired = {ours_program for _, ours_program, _, _ in PAIRS}
    mine = our_greedy({p: ours.models[p] for p in ours.programs if p in paired}, prompt,
                      setup.agree_tokens)
    return [dict(g, prompt_len=len(prompt)) for g in greedy_pairs(mine, theirs)]
