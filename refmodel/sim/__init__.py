"""Serving at scale on paper: the serving engine's own scheduler driven by predicted step
times instead of a model, and analytic models of designs no laptop can run.

    cluster.py    Chip (roofline of one device) and Link (bytes/s + latency, all-reduce)
    simulator.py  Simulator: the engine's Scheduler, PagePool and RadixCache on a virtual
                  clock, each step's time from a predictor
    predict.py    TableTime (measured call times of this engine), RooflineTime (counted
                  FLOPs and bytes on a Chip, plus a cost per compiled kernel: this engine's
                  calls; or an ideal fused engine with tensor parallelism), step_plan (a
                  recorded step as a Plan, to price each step an engine ran)
    disagg.py     prefill/decode disaggregation: prefill and decode pools, the KV cache of
                  each prompt moved over a link, xPyD searched (DistServe, Splitwise)
    afd.py        attention-FFN disaggregation with micro-batch ping-pong (MegaScale-Infer)
    sram.py       SRAM-only decode chips: chips to hold a model, layer pipelines, heterogeneous
                  prefill on GPUs and decode on SRAM chips (Groq, Cerebras)
"""
