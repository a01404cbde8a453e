"""What every study command (serve, simulate, speculative, quant, collectives, parallel,
decode) shares: comma-list options, --out and --no-plot, the progress bar, the saved roofs it
predicts with, and `finish`, the step each one ends in.

`finish` writes NAME.json, NAME.md and the figures into the output folder as one set (written
whole or not at all: files.output_set), then prints the summary and where each file went. The
summary and figures come from plots.saved, the same code that `figures` redraws them with, so
a study's files read the same whether just measured or redrawn from figures/data.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

# Where a study finds this machine's roofs when --peaks is not given: the main job's output,
# then the committed ones of this kind of machine (figures/data/<machine>/), each only when it
# was measured on this kind of machine.
DEFAULT_PEAKS = ("results/microbench/peaks.json", "figures/data/<machine>/peaks.json")


def names(text: str) -> tuple[str, ...]:
    """"a, b,c" -> ("a", "b", "c")."""
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _numbers(kind: type, what: str) -> Callable[[str], tuple]:
    def parse(text: str) -> tuple:
        try:
            return tuple(kind(x) for x in names(text))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: give comma-separated {what}") from None

    return parse


ints = _numbers(int, "integers")
floats = _numbers(float, "numbers")


def add_output(p, default: str) -> None:
    """--out (default `default`) and --no-plot, the options every study command ends with."""
    p.add_argument("--out", default=default, help="output folder")
    p.add_argument("--no-plot", action="store_true", help="write the JSON and summary only")


@contextlib.contextmanager
def progress_bar(desc: str, total: int | None = None, unit: str = "part"
                 ) -> Iterator[Callable[[str], None]]:
    """A progress bar that goes when done; yields progress(what), told what runs next."""
    from tqdm import tqdm

    with tqdm(total=total, desc=desc, unit=unit, leave=False) as bar:
        def progress(what: str) -> None:
            bar.set_postfix_str(what)
            bar.update(1)

        yield progress


def peaks_file(path: str | None) -> str | None:
    """The peaks.json a study predicts with (machines.peaks_here): --peaks, else the first of
    DEFAULT_PEAKS that exists and was measured on this kind of machine; None when there is
    none. A named file that is missing, or that another kind of machine measured, fails here,
    before anything is measured: a study's figure shows one machine."""
    from microbench import machines

    found = machines.peaks_here(path)
    return None if found is None else str(found)


def saved_roofs(path: str | None) -> dict | None:
    """The roofs a study predicts with (speculative.roofs_from_peaks) from peaks_file(path);
    None when there is none."""
    from microbench.files import read_json
    from microbench.studies.speculative import roofs_from_peaks

    path = peaks_file(path)
    if path is None:
        return None
    root = Path(__file__).resolve().parents[2]  # the project's folder
    shown = Path(path).resolve()  # named as the reader finds it: inside the project, relative
    shown = shown.relative_to(root) if shown.is_relative_to(root) else shown
    return roofs_from_peaks(read_json(path), str(shown))


def finish(name: str, result: dict, out_dir, t0: float, plot: bool = True,
           keep_copy: bool = False) -> int:
    """The end of every study command: out_dir/NAME.json, NAME.md and (with `plot`) the
    figures as one set, then the summary and the files written printed. With `keep_copy` the
    result is also saved as NAME-last.json in the temporary folder first, so a run of minutes
    survives a figure that fails to draw (the set is then discarded). Returns the exit code."""
    from microbench.files import output_set, write_json_atomic
    from microbench.plots.saved import draw_study

    if keep_copy:
        write_json_atomic(Path(tempfile.gettempdir()) / f"{name}-last.json", result)
    with output_set(out_dir) as tmp:
        written = [write_json_atomic(tmp / f"{name}.json", result)]
        summary, drawn = draw_study(name, result, tmp, plot)
    wrote = [Path(out_dir) / p.relative_to(tmp) for p in written + drawn]
    seconds = time.perf_counter() - t0
    print(summary)
    print(f"wrote {', '.join(map(str, wrote))} in {seconds:.{1 if seconds < 10 else 0}f} s")
    return 0
