"""microbench: measure a machine's roofline (compute and bandwidth ceilings) honestly, time the
model's phases against it, run the serving studies, and draw every figure from saved results.

Where things are (each subpackage's __init__ lists its files):
    roofs/     what the machine can do: GEMM and FMA, STREAM bandwidth, the memory hierarchy
               and its plateaus, the intensity sweep, the C and numpy peers in interleaved
               rounds, drift probes, the per-call floor; `roofs/peaks.py` runs them all
    phases/    the model's phases timed against the roofs: a phase point and its prediction,
               the sweeps, the per-op breakdown, the speed report, the main job (suite.py)
    studies/   serving, the simulator, serving at scale on paper, speculative decoding,
               quantization, tensor and expert parallelism, collectives, the decode race
    plots/     every figure and summary, from saved JSON only, without JAX
    commands/  one module per `python -m microbench <command>`; study.py holds `finish`,
               the step every study command ends in
The shared core beside them: harness.py (how everything is timed, the environment block),
files.py (atomic writers, a run's files as one set, JSON read with limits), schema.py (the
result files), roofline.py (the one owner of roofline arithmetic, no JAX), hardware.py (vendor
and theoretical ceilings), machines.py (which machine made a result: its name, its folder
figures/data/<machine>/, one machine per figure), sysinfo.py (what the OS says), blas.py (one
BLAS thread), cli.py.

Reading order: harness.py, roofline.py, roofs/peaks.py, phases/points.py, plots/, then a study.
Method: the README's method section, after the Empirical Roofline Toolkit, STREAM/BabelStream
and mixbench.
"""
