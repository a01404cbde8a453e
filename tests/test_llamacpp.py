"""The llama.cpp peer (microbench.studies.llamacpp): the GGUF file holds refmodel's weights, read
back with gguf's own reader and the RoPE reordering undone; configs the "llama" graph cannot run are
refused by name; llama.cpp, given the file, picks the same greedy tokens as refmodel and, with
logits_all, returns refmodel's logits at every position; its quantizer writes its own formats,
whose bytes gguf_info counts as gguf's block table does."""

import numpy as np
import pytest

import refmodel
from conftest import tiny
from microbench.studies import llamacpp

gguf = pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    cfg = tiny(rope_theta=500.0, norm_eps=1e-5, max_position=64)
    model = refmodel.init(cfg, seed=3)
    path = llamacpp.gguf_from_model(model, tmp_path_factory.mktemp("gguf") / "tiny.gguf")
    return model, path


def test_permute_rope_pairs_each_heads_halves():
    H, heads = 8, 2
    w = np.arange(heads * H)[:, None].astype(np.float32)  # row r holds r
    got = llamacpp.permute_rope(w, heads)[:, 0]
    # head 0: rows 0..3 (first half) and 4..7 (second half) interleave: 0 4 1 5 2 6 3 7
    np.testing.assert_array_equal(got, [0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15])
    np.testing.assert_array_equal(llamacpp.unpermute_rope(llamacpp.permute_rope(w, heads),
                                                          heads), w)


def test_gguf_holds_the_weights_and_metadata(written):
    model, path = written
    cfg = model.cfg
    D, N, K, H, F, V = (cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.resolved_head_dim,
                        cfg.d_ff, cfg.vocab_size)
    reader = gguf.GGUFReader(path)
    tensors = {t.name: t for t in reader.tensors}
    assert len(tensors) == 3 + 9 * cfg.n_layers

    def check(name, want, heads=None):  # want: refmodel's array in GGUF's [out, in] rows
        t = tensors[name]
        assert t.tensor_type == gguf.GGMLQuantizationType.F32, name
        assert tuple(int(n) for n in t.shape) == tuple(reversed(want.shape)), name  # ne order
        got = np.asarray(t.data).reshape(want.shape)
        if heads is not None:
            got = llamacpp.unpermute_rope(got, heads)
        np.testing.assert_array_equal(got, want, err_msg=name)

    def arr(p, inputs=1):  # a weight [*in, *out] as its matrix [prod(in), prod(out)]
        a = np.asarray(p[...], np.float32)
        return a.reshape(int(np.prod(a.shape[:inputs])), -1) if a.ndim > 2 else a

    check("token_embd.weight", arr(model.embed.embedding))  # [V, D]
    check("output.weight", arr(model.lm_head).T)  # [V, D]
    check("output_norm.weight", arr(model.final_norm.scale))  # [D]
    for i, b in enumerate(model.blocks):
        check(f"blk.{i}.attn_norm.weight", arr(b.attn_norm.scale))
        check(f"blk.{i}.attn_q.weight", arr(b.attn.wq).T, heads=N)  # [N*H, D]
        check(f"blk.{i}.attn_k.weight", arr(b.attn.wk).T, heads=K)  # [K*H, D]
        check(f"blk.{i}.attn_v.weight", arr(b.attn.wv).T)
        check(f"blk.{i}.attn_output.weight", arr(b.attn.wo, 2).T)  # [D, N*H]
        check(f"blk.{i}.ffn_norm.weight", arr(b.ffn_norm.scale))
        check(f"blk.{i}.ffn_gate.weight", arr(b.ffn.w_gate).T)  # [F, D]
        check(f"blk.{i}.ffn_up.weight", arr(b.ffn.w_up).T)
        check(f"blk.{i}.ffn_down.weight", arr(b.ffn.w_down).T)  # [D, F]
    assert tensors["blk.0.ffn_up.weight"].shape.tolist() == [D, F]

    def field(key):
        return reader.fields[key].contents()

    assert field("general.architecture") == "llama"
    assert field("general.file_type") == int(gguf.LlamaFileType.ALL_F32)
    want = {"context_length": 64, "embedding_length": D, "block_count": cfg.n_layers,
            "feed_forward_length": F, "attention.head_count": N, "attention.head_count_kv": K,
            "attention.key_length": H, "attention.value_length": H,
            "rope.dimension_count": H}
    for key, value in want.items():
        assert field(f"llama.{key}") == value, key
    assert field("llama.rope.freq_base") == pytest.approx(500.0)
    assert field("llama.attention.layer_norm_rms_epsilon") == pytest.approx(1e-5)
    assert field("tokenizer.ggml.model") == "llama"
    tokens = field("tokenizer.ggml.tokens")
    assert len(tokens) == V and len(set(tokens)) == V and tokens[7] == "<t7>"
    assert len(field("tokenizer.ggml.scores")) == V
    assert field("tokenizer.ggml.bos_token_id") == 1
    assert field("tokenizer.ggml.eos_token_id") == 2


@pytest.mark.parametrize("changes, field", [
    (dict(ffn="moe"), "layer_ffns"),
    (dict(attention="mla"), "layer_kinds"),
    (dict(layer_pattern=("sliding", "gqa")), "layer_kinds"),
    (dict(mlp_act="geglu"), "mlp_act"),
    (dict(norm="layernorm"), "norm"),
    (dict(position="learned"), "position"),
    (dict(rope_fraction=0.5), "rope_fraction"),
    (dict(attn_bias=True), "attn_bias"),
    (dict(qk_norm=True), "qk_norm"),
    (dict(final_softcap=30.0), "final_softcap"),
    (dict(dtype="bfloat16"), "dtype"),
    (dict(weight_format="int8"), "weight_format"),
    (dict(query_scale=7.0), "query_scale"),
])
def test_refuses_what_llama_cannot_run(changes, field, tmp_path):
    cfg = tiny(**changes)
    with pytest.raises(ValueError, match=field) as e:
        llamacpp.check_config(cfg)
    assert "allowed" in str(e.value)
    if changes == dict(attn_bias=True):  # the writer refuses before writing anything
        with pytest.raises(ValueError, match=field):
            llamacpp.gguf_from_model(refmodel.init(cfg), tmp_path / "x.gguf")
        assert not (tmp_path / "x.gguf").exists()


def test_llama_cpp_decodes_as_refmodel(written):
    pytest.importorskip("llama_cpp")
    model, path = written
    prompt = np.random.default_rng(0).integers(0, model.cfg.vocab_size, 12)
    want = np.asarray(refmodel.generate(model, prompt[None], 8))[0, len(prompt):]
    logits = np.asarray(refmodel.forward(model, prompt[None]))[0, -1]
    server = llamacpp.Server(path, context=16, threads=1)
    try:
        assert server.greedy(prompt, 8) == want.tolist()
        np.testing.assert_allclose(server.logits(prompt), logits, rtol=1e-4, atol=1e-4)
        result = server.round(2)
        assert len(result["samples"]) == 2 and result["threads"] == 1
        assert result["version"] == server.version
    finally:
        server.close()
    assert server._proc.poll() is not None


def test_llama_cpp_quantizes_in_its_own_formats(written, tmp_path):
    """llama.cpp's quantizer writes Q8_0 and Q4_0 files of our F32 GGUF; gguf_info's bits per
    weight are the tensors' bytes as gguf's own block table (GGML_QUANT_SIZES) counts them."""
    pytest.importorskip("llama_cpp")
    _, path = written
    for ftype in ("Q8_0", "Q4_0"):
        out = llamacpp.quantize(path, tmp_path / f"{ftype}.gguf", ftype, threads=1)
        info = llamacpp.gguf_info(out)
        tensors = [t for t in gguf.GGUFReader(out).tensors if t.name != "token_embd.weight"]
        matrices = [t for t in tensors if len(t.shape) >= 2]

        def nbytes(t):  # elements / block size * bytes per block
            block, size = gguf.GGML_QUANT_SIZES[t.tensor_type]
            return int(t.n_elements) // block * size

        want = 8 * sum(nbytes(t) for t in matrices) / sum(int(t.n_elements) for t in matrices)
        assert info["matrix_bpw"] == pytest.approx(want)
        assert info["step_weight_bytes"] == sum(nbytes(t) for t in tensors)
        assert info["types"][ftype] >= 1 and info["types"]["F32"] >= 1  # the norms stay F32
        assert info["file_bytes"] == out.stat().st_size
    assert llamacpp.gguf_info(tmp_path / "Q8_0.gguf")["matrix_bpw"] == 8.5  # 34 B per 32
    with pytest.raises(ValueError, match="ftype='Q2_K' is not allowed"):
        llamacpp.quantize(path, tmp_path / "x.gguf", "Q2_K")


def test_sequence_logits_are_every_positions_logits(written):
    pytest.importorskip("llama_cpp")
    model, path = written
    prompt = np.random.default_rng(1).integers(0, model.cfg.vocab_size, 12)
    want = np.asarray(refmodel.forward(model, prompt[None]))[0]  # [T, V]
    server = llamacpp.Server(path, context=16, threads=1, logits_all=True)
    try:
        got = server.sequence_logits(prompt)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(server.logits(prompt), want[-1], rtol=1e-4, atol=1e-4)
    finally:
        server.close()
    plain = llamacpp.Server(path, context=16, threads=1)
    try:
        with pytest.raises(ValueError, match="logits_all=True"):
            plain.sequence_logits(prompt)
    finally:
        plain.close()
