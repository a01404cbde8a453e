"""microbench: measure a machine's roofline (compute and bandwidth ceilings) honestly.

Reading order: harness.py (how everything is timed, the environment block, atomic writers),
schema.py (the result file), compute.py and bandwidth.py (the kernels and their analytic
counts), plateaus.py (naming the memory levels of a sweep), intensity.py (the AI sweep),
hardware.py (vendor and theoretical ceilings), guard.py (values above a ceiling are errors),
peaks.py (the whole measurement), peers.py (other programs on the same machine), plot.py (every
figure, drawn from saved JSON), cli.py (the command line). Method: /METHOD.md in the lab notes,
after the Empirical Roofline Toolkit, STREAM/BabelStream and mixbench.
"""
