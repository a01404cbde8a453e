"""Studies: what the roofline says about serving, each a measurement (or a model on spec
chips) with its own command, result file and figures (plots/). Each module's docstring says
what it measures and why.

    serve.py        the serving engine under a seeded trace: policies, rates, prefix cache
    simulate.py     the simulator checked against the engine on this machine
    scale.py        serving at scale on paper: TP, PD and attention-FFN disaggregation, SRAM
    speculative.py  speculative decoding: acceptance, speedup measured vs predicted
    quant.py        quantized weights and KV cache: formulations, steps, quality
    parallel.py     tensor and expert parallelism on paper, from the cost model
    collectives.py  collective bandwidth against message size on this machine's devices
    decode.py       the decode race: our step against the C read, llama.cpp, transformers
    decode_formats.py  the decode race's formats: ours and llama.cpp's, bits per weight, pairs
    decode_peers.py    the decode race's peers: llama.cpp per format, transformers, greedy pairs
    decode_quality.py  each format's KL from float32 on held-out text, greedy agreement
    llamacpp.py     llama.cpp as a decode peer: our weights in a GGUF, served by it
    host.py         the public API's host cost: decode_step against the jitted step it runs
"""
