"""One module per CLI subcommand, named after it (the table is cli.COMMANDS), each with
`add_args(parser)` and `run(args) -> int`:

    roofs and phases   peaks.py, phases.py, breakdown.py, run.py (the main job)
    accelerators       pallas.py (Pallas kernels vs their XLA references), pack.py and
                       unpack.py (an accelerator run's results as one file, and back)
    studies            serve.py, simulate.py, speculative.py, quant.py, collectives.py,
                       parallel.py, decode.py
    drawing            figures.py, plot.py; hardware.py lists the spec database

study.py is what the study commands share: comma-list and output options, the progress bar,
the saved roofs, and `finish`, the step each one ends in (result file, summary, figures, one
set).
"""
