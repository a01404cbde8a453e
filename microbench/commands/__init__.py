"""One module per CLI subcommand, each with `add_args(parser)` and `run(args) -> int`."""
