"""microbench: measure a machine's roofline (compute and bandwidth ceilings) honestly.

Reading order: harness.py (how everything is timed, the environment block), files.py (atomic
writers, a run's files as one set, JSON inputs read with limits), schema.py (the result
files), roofline.py (the one owner of roofline arithmetic, no JAX: which roof to use, which
level is main memory, the level that holds a working set, ridge points, predicted times,
"above its roof"), compute.py and bandwidth.py (the kernels and their analytic counts),
native.py (the C peer), rounds.py (main roofs in interleaved rounds beside numpy and C),
hierarchy.py (bandwidth per level at a fixed thread count), plateaus.py (naming
the memory levels of a sweep), intensity.py (the AI sweep), probe.py (drift probes),
overhead.py (the per-call floor), hardware.py (vendor and theoretical ceilings), guard.py
(values above a ceiling are errors), peaks.py (the whole measurement), points.py / sweeps.py /
report.py / breakdown.py (phase points, their predictions and where their time goes), plots/
(every figure, drawn from saved JSON without JAX: common, roofline, hierarchy, claims, points,
sweeps, breakdown), suite.py (the main job), cli.py and commands/ (the command line). Method:
the README's method section, after the Empirical Roofline Toolkit, STREAM/BabelStream and
mixbench.
"""
