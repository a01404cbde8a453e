"""Roofs: what this machine's compute and memory can do, measured (and checked) before any
model runs. `peaks.py` is the whole measurement (`python -m microbench peaks`); open it first.

    peaks.py      every roof below in one run, derived and written (peaks.json, peaks.csv)
    compute.py    the matrix unit (GEMM per dtype) and the vector unit (an FMA chain)
    bandwidth.py  the STREAM family and the working-set sweep
    intensity.py  the arithmetic-intensity sweep: one kernel, FLOPs per byte as a parameter
    hierarchy.py  read bandwidth per memory level at a fixed thread count, checked monotone
    plateaus.py   the plateaus of a working-set sweep, named after the memory levels
    native.py     a small C program: memory with no compiler in the way (the C read)
    peers.py      the environment peer programs run in
    rounds.py     the main roofs in interleaved rounds beside numpy and C
    probe.py      drift probes: a short read and a short GEMM around each phase point
    overhead.py   the per-call floor of a compiled phase: dispatch plus a cost per kernel
    guard.py      a value above its ceiling is a bug signal, never a roof
    synthetic.py  a peaks result with known roofs, for tests and figures without measuring
    platform.py   which path `--platform` takes (CPU or accelerator, forced on a CPU)
    device.py     an accelerator's roofs: HBM read and copy, GEMM per dtype vs the spec
    pallas_copy.py  the device-memory peer written in Pallas
    hlo.py        what a compiled GEMM multiplies in (fp8 or not), read from its HLO
"""
