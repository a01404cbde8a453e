"""Command line: `python -m microbench <command> ...`, subcommands registered from one table.

Each command lives in a module that defines `add_args(parser)` and `run(args) -> int`; the
table COMMANDS maps a name to (help, module path), and only the module of the command being
run is imported (`build_parser`), so a command's heavy imports (jax) never reach another.
To add a command, append a line to COMMANDS (e.g. `Command("phases", "time the model's
phases", "microbench.commands.phases")`), or call `register(...)` before `main()`.

Errors are one line, never a traceback: bad input (ValueError, KeyError) and every OSError,
named by its path, exit 2 (SystemExit); Ctrl-C (SIGINT) and SIGTERM exit 130 / 143 with one
line, after the command's `files.output_set` has removed the unfinished run's files.
Everything printed from an error is escaped for the terminal (`files.printable`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from microbench import blas
from microbench.files import printable


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    module: str  # defines add_args(parser) and run(args) -> int


COMMANDS: list[Command] = [
    Command("peaks", "measure this machine's roofs (GEMM, FMA, STREAM, sweeps)",
            "microbench.commands.peaks"),
    Command("plot", "redraw the roofline from saved results (several machines at once)",
            "microbench.commands.plot"),
    Command("hardware", "list the spec database (vendor peaks, dense, with sources)",
            "microbench.commands.hardware"),
    Command("phases", "time the model's phases against the roofs (--report: speed report)",
            "microbench.commands.phases"),
    Command("run", "the main job: roofs, phase sweeps, every figure and a summary table",
            "microbench.commands.run"),
    Command("figures", "redraw every figure in figures/ from figures/data",
            "microbench.commands.figures"),
    Command("breakdown", "where a phase's time goes, per op, beside its counted cost",
            "microbench.commands.breakdown"),
    Command("serve", "the serving engine under load: TTFT, TPOT, goodput, prefix caching",
            "microbench.commands.serve"),
    Command("simulate", "the simulator against the engine (MAPE), then serving at scale on "
            "paper: TP, PD and attention-FFN disaggregation, SRAM chips",
            "microbench.commands.simulate"),
    Command("speculative", "speculative decoding on the trained pair: acceptance vs k, "
            "measured vs predicted speedup, the verify step on the roofline",
            "microbench.commands.speculative"),
    Command("quant", "quantized weights and KV cache: which product formulation is fast, "
            "decode and prefill per precision vs counted bytes, bits per byte per format",
            "microbench.commands.quant"),
    Command("collectives", "all-reduce, all-gather, reduce-scatter, all-to-all: bus bandwidth "
            "vs message size (emulated CPU devices on a CPU) beside vendor link specs",
            "microbench.commands.collectives"),
    Command("parallel", "tensor and expert parallelism on paper: when TP stops paying, EP's "
            "all-to-all vs expert weight bytes, from the cost model on spec chips",
            "microbench.commands.parallel"),
    Command("decode", "the decode race: our step (XLA's products and the native kernel) vs "
            "the C read, the GEMM and llama.cpp / transformers, in interleaved rounds",
            "microbench.commands.decode"),
    Command("pallas", "refmodel's Pallas kernels (decode attention, paged, grouped matmul) "
            "timed against their XLA references", "microbench.commands.pallas"),
    Command("pack", "pack an accelerator run's results into one .tar.gz",
            "microbench.commands.pack"),
    Command("unpack", "unpack an accelerator run's .tar.gz into figures/data/<machine>/ and "
            "draw it", "microbench.commands.unpack"),
]


def register(name: str, help: str, module: str) -> None:
    """Add (or replace) a subcommand at run time."""
    COMMANDS[:] = [c for c in COMMANDS if c.name != name] + [Command(name, help, module)]


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """Every subcommand, with the options of `command` only (None: of all). Only the modules
    whose options are added are imported, so one command never pays for another's imports:
    `figures` draws without JAX though `serve`'s options come from a module that imports it."""
    parser = argparse.ArgumentParser(prog="python -m microbench",
                                     description="Measure and draw this machine's roofline.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for cmd in COMMANDS:
        p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.help)
        if command is None or cmd.name == command:
            mod = importlib.import_module(cmd.module)
            mod.add_args(p)
            p.set_defaults(_run=mod.run)
    return parser


def _terminated(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: Sequence[str] | None = None) -> int:
    prog = "python -m microbench"
    main_thread = threading.current_thread() is threading.main_thread()
    if main_thread:  # unwind on SIGTERM (and clean up) as on Ctrl-C
        previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        argv = sys.argv[1:] if argv is None else list(argv)
        # the top level has no option but --help: a command, if any, is the first argument
        parser = build_parser(argv[0] if argv and not argv[0].startswith("-") else "")
        args = parser.parse_args(argv)
        prog = f"{parser.prog} {args.command}"
        blas.one_thread()  # LAPACK's spinning worker would hold a core (microbench.blas)
        return int(args._run(args) or 0)
    except KeyboardInterrupt as err:
        name = str(err.args[0]) if err.args else ""
        name = name if name in ("SIGINT", "SIGTERM") else "SIGINT"
        sys.stderr.write(f"{prog}: interrupted ({name}); no file of the unfinished run was "
                         "kept, the output folder holds its previous files\n")
        raise SystemExit(128 + int(getattr(signal, name))) from None
    except BrokenPipeError:  # the reader went away (`... | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(128 + signal.SIGPIPE) from None
    except (ValueError, KeyError, OSError) as err:  # bad input: a message, no trace
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        if isinstance(err, OSError) and err.filename is not None:
            message = f"{err.filename}: {err.strerror or err}"
        sys.stderr.write(printable(f"{prog}: error: {message}") + "\n")
        raise SystemExit(2) from None
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
