"""llama.cpp as a peer program for decode: the same weights, run by another engine.

A decode step's time means little alone: is 80 ms per token slow for this machine? This module
answers with llama.cpp (Gerganov et al., github.com/ggml-org/llama.cpp, through the
llama-cpp-python bindings), the engine most people run on a CPU, given the very weights of a
`refmodel` Transformer, so the two programs decode the same model at the same context:

  * `gguf_from_model(model, path)` writes the model as a float32 GGUF file of llama.cpp's
    "llama" architecture. Weights go over as they are, transposed from refmodel's input-major
    [in, out] to the [out, in] rows GGUF stores (a torch Linear's layout); only the query and
    key rows are reordered (`permute_rope`, below), and a config the "llama" graph cannot run
    (MoE, biases, qk-norm, soft-caps, partial rotary, ...) is refused with a ValueError that
    names the field.
  * `Server(gguf_path, context)` loads that file once in a long-lived child process, so the
    rounds of a benchmark can be interleaved with other programs' (`microbench.roofs.rounds`); its
    `round(steps)` times single-token decode steps at a fixed context, `greedy` and `logits`
    let a test check that llama.cpp computes the same function as refmodel; with
    `logits_all=True`, `sequence_logits` returns its logits at every position of a prompt.
  * `quantize(src, dst, ftype)` has llama.cpp's own quantizer (`llama_model_quantize`, what
    its llama-quantize tool calls) rewrite that F32 file in one of the formats its users run
    (QUANT_TYPES), with its default choices per tensor; `gguf_info` says what the file holds.

RoPE. refmodel rotates channel i with channel i + H/2 of each head (rotate-half, as Hugging
Face's Llama does; refmodel/attention/common.py), while llama.cpp's "llama" graph rotates the
adjacent pairs (2i, 2i + 1), as Meta's original code did. Reordering each head's query and key
rows from [first half; second half] to interleaved pairs makes llama.cpp's rotation act on the
same channel pairs with the same frequencies; the scores q.k are unchanged because q and k are
reordered alike, and v and the output projection are untouched. This is the permutation of
llama.cpp's convert_hf_to_gguf.py (`LlamaModel.permute`).

Vocabulary. llama.cpp will not load a model without one. Tokens are fed here as ids, never as
text, so the file carries placeholders: a SentencePiece ("llama") vocabulary of cfg.vocab_size
pieces "<t0>", "<t1>", ... with zero scores, unk 0, bos 1 and eos 2 as SentencePiece's
defaults. Nothing reads them; llama.cpp only logs, when verbose, that it finds no newline piece
("<0x0A>") and that the eos piece is not marked end-of-generation.

The peer is optional: `available()` says why it cannot run (install the `peers` extra).

Public API:
    available() -> str | None
    gguf_from_model(model, path) -> Path
    check_config(cfg) -> None                       the refusals of gguf_from_model
    permute_rope(w, heads) -> np.ndarray            [heads*H, D] rotate-half rows -> pairs
    unpermute_rope(w, heads) -> np.ndarray          its inverse
    quantize(src, dst, ftype, threads=None) -> Path ftype one of QUANT_TYPES
    gguf_info(path) -> {"file_bytes", "file_bpw", "types", "matrix_bpw", "step_weight_bytes"}
    Server(gguf_path, context, threads=None, flash_attn=False, logits_all=False)
        .round(steps) -> {"step_s", "samples", "context", "threads", "version", ...}
        .greedy(prompt_ids, n) -> list[int]
        .logits(prompt_ids) -> np.ndarray [V]
        .sequence_logits(prompt_ids) -> np.ndarray [T, V]   (logits_all=True only)
        .close()
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import weakref
from pathlib import Path

import numpy as np

from microbench.roofs.peers import close_child, peer_environment

ARCH = "llama"
# Room past the timed context for `greedy` and `logits` (prompt + new tokens <= n_ctx).
EXTRA_CONTEXT = 256


def available() -> str | None:
    """None when llama.cpp's bindings and the GGUF writer import, else the reason."""
    missing = []
    for name, pip_name in (("llama_cpp", "llama-cpp-python"), ("gguf", "gguf")):
        try:
            __import__(name)
        except ImportError as e:
            missing.append(f"{pip_name} ({e})")
    if missing:
        return (f"not installed: {', '.join(missing)}; install the `peers` extra "
                "(pip install -e '.[peers]')")
    return None


# The GGUF file ---------------------------------------------------------------------------------

# (field, the value llama.cpp's "llama" graph needs, what that means), each checked by `==`.
LLAMA_FIELDS = (
    ("mlp_act", "swiglu", "the gated SiLU FFN"),
    ("mlp_bias", False, "no FFN biases"),
    ("norm", "rmsnorm", "RMSNorm"),
    ("post_norms", False, "pre-norm blocks only"),
    ("position", "rope", "RoPE"),
    ("rope_fraction", 1.0, "rotary over the whole head"),
    ("attn_bias", False, "no q/k/v/o biases"),
    ("qk_norm", False, "no norm on q and k"),
    ("attn_out_gate", False, "no output gate"),
    ("attn_sinks", False, "no sink logits"),
    ("attn_softcap", None, "no attention soft-cap"),
    ("final_softcap", None, "no logit soft-cap"),
    ("dtype", "float32", "float32 weights (the file is F32)"),
    ("weight_format", "none", "unquantized weights"),
    ("kv_format", "none", "a float cache, as llama.cpp's"),
    ("backend", "xla", "weights as declared (other backends store them their own way)"),
)


def check_config(cfg) -> None:
    """Raise ValueError naming the first field of `cfg` llama.cpp's "llama" graph cannot run."""
    kinds = set(cfg.layer_kinds)
    if len(kinds) != 1 or not kinds <= {"mha", "gqa", "mqa"}:
        raise ValueError(f"layer_kinds={cfg.layer_kinds!r} is not allowed: llama.cpp's llama "
                         "architecture needs the same softmax attention in every layer, one of "
                         "'gqa', 'mha', 'mqa' (attention=..., layer_pattern=None)")
    if set(cfg.layer_ffns) != {"dense"}:
        raise ValueError(f"layer_ffns={cfg.layer_ffns!r} is not allowed: llama.cpp's llama "
                         "architecture is written here with a dense FFN in every layer "
                         "(ffn='dense', ffn_pattern=None)")
    for field, want, meaning in LLAMA_FIELDS:
        if getattr(cfg, field) != want:
            raise ValueError(f"{field}={getattr(cfg, field)!r} is not allowed: llama.cpp's "
                             f"llama architecture needs {field}={want!r} ({meaning})")
    H = cfg.resolved_head_dim
    if cfg.query_scale not in (None, H):
        raise ValueError(f"query_scale={cfg.query_scale!r} is not allowed: llama.cpp scales "
                         f"scores by head_dim**-0.5; allowed: None or {H}")


def permute_rope(w: np.ndarray, heads: int) -> np.ndarray:
    """Rows [heads*H, D] of a query or key projection, each head's rows reordered from
    rotate-half (channel i pairs with i + H/2) to adjacent pairs (2i with 2i + 1): row 2i of a
    head is its old row i, row 2i + 1 its old row H/2 + i (convert_hf_to_gguf.py's permute)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2) \
        .reshape(w.shape)


def unpermute_rope(w: np.ndarray, heads: int) -> np.ndarray:
    """The inverse of `permute_rope`: adjacent pairs back to rotate-half rows."""
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2) \
        .reshape(w.shape)


def gguf_tensors(model) -> dict[str, np.ndarray]:
    """{GGUF name: float32 array [out, in] (norms and the embedding as they are)}."""
    from refmodel.attention.gqa import kv_heads

    cfg = model.cfg
    N, K = cfg.n_heads, kv_heads(cfg, cfg.layer_kinds[0])

    def rows(w, inputs: int = 1):  # refmodel's [*in, *out] -> GGUF's [prod(out), prod(in)]
        a = np.asarray(w[...], np.float32)
        return np.ascontiguousarray(a.reshape(int(np.prod(a.shape[:inputs])), -1).T)

    embed = np.asarray(model.embed.embedding[...], np.float32)  # [V, D]
    out = {"token_embd.weight": embed,
           "output_norm.weight": np.asarray(model.final_norm.scale[...], np.float32),
           # tied: the same table again (llama.cpp would also take it from token_embd)
           "output.weight": embed.copy() if cfg.tie_embeddings else rows(model.lm_head)}
    for i, block in enumerate(model.blocks):
        a, f = block.attn, block.ffn
        out |= {f"blk.{i}.attn_norm.weight": np.asarray(block.attn_norm.scale[...], np.float32),
                f"blk.{i}.attn_q.weight": permute_rope(rows(a.wq), N),  # [N*H, D]
                f"blk.{i}.attn_k.weight": permute_rope(rows(a.wk), K),  # [K*H, D]
                f"blk.{i}.attn_v.weight": rows(a.wv),  # [K*H, D]
                f"blk.{i}.attn_output.weight": rows(a.wo, 2),  # [D, N*H]
                f"blk.{i}.ffn_norm.weight": np.asarray(block.ffn_norm.scale[...], np.float32),
                f"blk.{i}.ffn_gate.weight": rows(f.w_gate),  # [F, D]
                f"blk.{i}.ffn_up.weight": rows(f.w_up),  # [F, D]
                f"blk.{i}.ffn_down.weight": rows(f.w_down)}  # [D, F]
    return out


def gguf_from_model(model, path) -> Path:
    """Write `model` (a refmodel Transformer) as a float32 GGUF of the "llama" architecture."""
    import gguf

    from refmodel.attention.gqa import kv_heads

    cfg = model.cfg
    check_config(cfg)
    H, V = cfg.resolved_head_dim, cfg.vocab_size
    path = Path(path)
    w = gguf.GGUFWriter(str(path), ARCH)
    w.add_name(f"refmodel {cfg.name}")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_context_length(cfg.max_position)  # trained context: only a warning when exceeded
    w.add_embedding_length(cfg.d_model)
    w.add_block_count(cfg.n_layers)
    w.add_feed_forward_length(cfg.d_ff)
    w.add_head_count(cfg.n_heads)
    w.add_head_count_kv(kv_heads(cfg, cfg.layer_kinds[0]))
    w.add_key_length(H)  # written out: head_dim may differ from d_model / n_heads
    w.add_value_length(H)
    w.add_rope_dimension_count(H)
    w.add_rope_freq_base(float(cfg.rope_theta))
    w.add_layer_norm_rms_eps(float(cfg.norm_eps))
    w.add_vocab_size(V)
    _add_vocabulary(w, V)
    for name, array in gguf_tensors(model).items():
        w.add_tensor(name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _add_vocabulary(w, V: int) -> None:
    """Placeholder SentencePiece pieces "<t{i}>": tokens are fed by id, never as text."""
    import gguf

    types = [gguf.TokenType.NORMAL] * V
    types[0] = gguf.TokenType.UNKNOWN
    for i in (1, 2):
        if i < V:
            types[i] = gguf.TokenType.CONTROL
    w.add_tokenizer_model("llama")
    w.add_token_list([f"<t{i}>" for i in range(V)])
    w.add_token_scores([0.0] * V)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(min(1, V - 1))
    w.add_eos_token_id(min(2, V - 1))
    w.add_add_bos_token(False)


# llama.cpp's own formats -----------------------------------------------------------------------

# The llama_ftype names (llama_cpp.LLAMA_FTYPE_MOSTLY_<name>) of the formats people deploy on a
# CPU: Q8_0 (int8, an fp16 scale per 32 weights: 8.5 bits), Q4_0 (4-bit, an fp16 scale per 32:
# 4.5 bits) and Q4_K_M (4-bit super-blocks of 256 with 6-bit sub-scales, some tensors in Q6_K).
QUANT_TYPES = ("Q8_0", "Q4_0", "Q4_K_M")


def quantize(src, dst, ftype: str, threads: int | None = None) -> Path:
    """llama.cpp's quantizer rewrites the GGUF `src` as `dst` in `ftype` (QUANT_TYPES) with its
    default choice per tensor: the norms stay F32, some matrices go to another type (the output
    matrix often Q6_K), and a tensor whose rows do not split into the format's blocks (Q4_K's
    256) falls back to one they do. `gguf_info(dst)` counts what it wrote. Runs in a child,
    as the Server does: llama.cpp's threads and log lines stay out of this process."""
    if ftype not in QUANT_TYPES:
        raise ValueError(f"ftype={ftype!r} is not allowed: choose one of {list(QUANT_TYPES)}")
    why = available()
    if why:
        raise RuntimeError(f"llama.cpp cannot quantize: {why}")
    threads = threads or len(os.sched_getaffinity(0))
    args = ["quantize", str(Path(src).resolve()), str(Path(dst).resolve()), ftype, str(threads)]
    done = subprocess.run([sys.executable, "-m", "microbench.studies.llamacpp", *args],
                          capture_output=True, text=True, env=peer_environment())
    if done.returncode != 0 or not Path(dst).exists():
        raise RuntimeError(f"llama.cpp could not quantize {src} to {ftype} (exit "
                           f"{done.returncode}): {done.stderr.strip()[-500:]}")
    return Path(dst)


def gguf_info(path) -> dict:
    """What a GGUF holds, as llama.cpp wrote it: its bytes, bits per weight (file bytes over the
    elements of its tensors), the tensors per type, and the matrices a decode step reads (every
    tensor but token_embd, of which a step reads one row): their bytes and bits per weight."""
    import gguf

    path = Path(path)
    tensors = gguf.GGUFReader(str(path)).tensors
    types: dict[str, int] = {}
    for t in tensors:
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
    step = [t for t in tensors if t.name != "token_embd.weight"]
    matrices = [t for t in step if len(t.shape) >= 2]
    file_bytes = path.stat().st_size
    return {"file_bytes": file_bytes,
            "file_bpw": 8.0 * file_bytes / sum(int(t.n_elements) for t in tensors),
            "types": dict(sorted(types.items())),
            "matrix_bpw": 8.0 * sum(int(t.n_bytes) for t in matrices)
            / sum(int(t.n_elements) for t in matrices),
            "step_weight_bytes": float(sum(int(t.n_bytes) for t in step))}


def _quantize_child(src: str, dst: str, ftype: str, threads: int) -> int:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    params.nthread = threads
    return int(llama_cpp.llama_model_quantize(src.encode(), dst.encode(), params))


# The peer -------------------------------------------------------------------------------------


class Server:
    """llama.cpp with one GGUF loaded in a child process, answering one command per call.

    The child evaluates a fixed prompt of `context` token ids (seeded, so every Server holds the
    same one) once; each step of `round` then decodes one token at position `context`, after
    removing whatever the previous step wrote there (llama-cpp-python's `eval` drops the cache
    past `n_tokens`), so every step of every round decodes at the same context (context + 1
    keys; llama.cpp rounds its cache up, to 512 cells for a requested 272, and masks the rest).
    The cache is float32 (type_k = type_v = F32), as refmodel's float32 cache: llama.cpp's
    default F16 cache would move half the cache bytes and round the keys. `logits_all`: the child
    keeps the logits of every position it evaluates (`sequence_logits`); a timing server leaves
    it off, as llama.cpp's users do."""

    def __init__(self, gguf_path, context: int, threads: int | None = None,
                 flash_attn: bool = False, logits_all: bool = False):
        why = available()
        if why:
            raise RuntimeError(f"the llama.cpp peer cannot run: {why}")
        if not isinstance(context, int) or context < 1:
            raise ValueError(f"context={context!r} must be a positive integer")
        self.threads = threads or len(os.sched_getaffinity(0))
        self.context = context
        self.logits_all = logits_all
        args = [str(Path(gguf_path).resolve()), str(context), str(self.threads),
                str(int(flash_attn)), str(int(logits_all))]
        # stderr to a file, not a pipe: llama.cpp's log lines could fill a pipe nobody reads
        self._stderr = tempfile.TemporaryFile(mode="w+")
        self._proc = subprocess.Popen([sys.executable, "-m", "microbench.studies.llamacpp", *args],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=self._stderr, text=True, env=peer_environment())
        # ends the child when closed, collected or at exit (before modules are torn down)
        self._finalizer = weakref.finalize(self, close_child, self._proc, "")
        ready = self._ask(None)
        self.version, self.n_ctx, self.system = ready["version"], ready["n_ctx"], ready["system"]

    def _ask(self, command: dict | None) -> dict:
        if command is not None:
            self._proc.stdin.write(json.dumps(command) + "\n")
            self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        if not line:
            self._proc.wait(timeout=30)
            self._stderr.seek(0)
            err = self._stderr.read().strip()[-500:]
            raise RuntimeError(f"llama.cpp peer stopped: {err or 'no output'}")
        answer = json.loads(line)
        if "error" in answer:
            raise ValueError(answer["error"])
        return answer

    def round(self, steps: int) -> dict:
        """Seconds of each of `steps` single-token decode steps at this server's context."""
        if not isinstance(steps, int) or steps < 1:
            raise ValueError(f"steps={steps!r} must be a positive integer")
        samples = self._ask({"cmd": "round", "steps": steps})["samples"]
        return {"step_s": float(np.median(samples)), "samples": samples,
                "context": self.context, "threads": self.threads, "version": self.version}

    def greedy(self, prompt_ids, n: int) -> list[int]:
        """The n token ids llama.cpp picks greedily (argmax) after `prompt_ids`."""
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"n={n!r} must be a positive integer")
        prompt = [int(t) for t in prompt_ids]
        return self._ask({"cmd": "greedy", "prompt": prompt, "n": n})["tokens"]

    def logits(self, prompt_ids) -> np.ndarray:
        """float32 [V]: llama.cpp's logits for the token after `prompt_ids`."""
        prompt = [int(t) for t in prompt_ids]
        return np.asarray(self._ask({"cmd": "logits", "prompt": prompt})["logits"], np.float32)

    def sequence_logits(self, prompt_ids) -> np.ndarray:
        """float32 [T, V]: llama.cpp's logits at every position of `prompt_ids` (row t: the
        token after the first t + 1), from one evaluation of the whole prompt."""
        if not self.logits_all:
            raise ValueError("sequence_logits needs a Server started with logits_all=True")
        prompt = [int(t) for t in prompt_ids]
        rows = self._ask({"cmd": "sequence_logits", "prompt": prompt})["logits"]
        return np.asarray(rows, np.float32)

    def close(self) -> None:
        self._finalizer()
        self._stderr.close()


def _serve(path: str, context: int, threads: int, flash_attn: bool, logits_all: bool) -> None:
    """The child: load the model, then answer JSON lines."""
    import llama_cpp

    n_ctx = context + EXTRA_CONTEXT
    llm = llama_cpp.Llama(model_path=path, n_ctx=n_ctx, n_batch=min(n_ctx, 512),
                          n_threads=threads, n_threads_batch=threads, logits_all=logits_all,
                          type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32,
                          flash_attn=flash_attn, verbose=False)
    commands = _commands(llm, context, n_ctx)
    system = llama_cpp.llama_print_system_info().decode()
    _answer({"version": llama_cpp.__version__, "n_ctx": n_ctx, "system": system})
    for line in sys.stdin:
        if not line.strip():
            break
        command = json.loads(line)
        try:
            _answer(commands[command["cmd"]](command))
        except (ValueError, KeyError, RuntimeError) as e:
            _answer({"error": f"{type(e).__name__}: {e}"})


def _commands(llm, context: int, n_ctx: int) -> dict:
    """{command: function of the command's JSON -> the answer} over the loaded model; `round`
    first evaluates the timed prompt of `context` seeded ids."""
    import time

    import llama_cpp

    V = llm.n_vocab()
    prompt = np.random.default_rng(0).integers(0, V, context).tolist()

    def last_logits() -> np.ndarray:
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(V,))

    def run(ids: list[int]) -> np.ndarray:  # from an empty cache: logits after ids
        if not ids or len(ids) > n_ctx or min(ids) < 0 or max(ids) >= V:
            raise ValueError(f"prompt of {len(ids)} ids must be non-empty, at most n_ctx={n_ctx} "
                             f"long, with ids in [0, {V - 1}]")
        llm.reset()
        llm.eval(ids)
        return last_logits()

    def round_(steps: int) -> dict:
        token, samples = int(np.argmax(run(prompt))), []
        for _ in range(steps):
            llm.n_tokens = context  # the next eval drops the previous step's entry first
            t0 = time.perf_counter()
            llm.eval([token])
            token = int(np.argmax(last_logits()))
            samples.append(time.perf_counter() - t0)
        return {"samples": samples}

    def greedy(prompt_ids: list[int], n: int) -> dict:
        if len(prompt_ids) + n > n_ctx:
            raise ValueError(f"{len(prompt_ids)} prompt + {n} new tokens exceed n_ctx={n_ctx}")
        tokens = [int(np.argmax(run(prompt_ids)))]
        while len(tokens) < n:
            llm.eval([tokens[-1]])
            tokens.append(int(np.argmax(last_logits())))
        return {"tokens": tokens}

    def sequence(ids: list[int]) -> list:  # logits_all: llm.scores holds every row
        run(ids)
        return np.asarray(llm.scores[:len(ids)], np.float32).tolist()

    return {"round": lambda c: round_(int(c["steps"])),
            "greedy": lambda c: greedy(c["prompt"], int(c["n"])),
            "logits": lambda c: {"logits": run(c["prompt"]).tolist()},
            "sequence_logits": lambda c: {"logits": sequence(c["prompt"])}}


def _answer(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    if sys.argv[1] == "quantize":
        sys.exit(_quantize_child(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])))
    _serve(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), bool(int(sys.argv[4])),
           bool(int(sys.argv[5])))
