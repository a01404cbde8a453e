"""Phases: the model's prefill and decode phases timed against the roofs, and where their time
goes. `points.py` times one phase and predicts it; open it first.

    timing.py     how one compiled phase is timed: the budget, the cold-call evictor, a label
    points.py     one measured phase point beside its counted cost and its prediction
    sweeps.py     the sweeps of points behind the figures (batch, context, variants)
    breakdown.py  one phase's time per op (a profiler trace) beside each op's counted cost
    report.py     the speed report: decode against main memory, prefill against the GEMM roof
    suite.py      the main job (`python -m microbench run`): roofs, sweeps, every figure
    device.py     the sweeps on an accelerator: bfloat16, a preset sized for the chip
"""
