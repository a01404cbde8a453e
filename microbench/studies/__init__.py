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
    llamacpp.py     llama.cpp as a decode peer: our weights in a GGUF, served by it
"""
