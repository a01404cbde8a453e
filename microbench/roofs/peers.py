"""The environment peer programs run in (microbench.roofs.rounds, microbench.roofs.native).

A roof is only as credible as its distance to what other programs reach on the same machine
in the same run; the peers themselves live in microbench.roofs.rounds (numpy) and
microbench.roofs.native (C). They run in children whose environment drops OPENBLAS_CORETYPE
and OPENBLAS_L2_SIZE: a core type pinned for the wrong CPU can make OpenBLAS several times
slower. The variables are removed for the children only, never globally (tests and CI keep
them).
"""

from __future__ import annotations

import os
import subprocess

PEER_ENV_DROP = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def peer_environment() -> dict:
    """This process's environment minus the OpenBLAS pins (for peer children only)."""
    return {k: v for k, v in os.environ.items() if k not in PEER_ENV_DROP}


def close_child(proc: subprocess.Popen, last_line: str = "") -> None:
    """End a long-lived peer child: send `last_line` (its stop word, if any), close its
    stdin, wait up to 30 s, and kill it if it does not go."""
    if proc.poll() is not None:
        return
    try:
        if last_line:
            proc.stdin.write(last_line)
        proc.stdin.close()
        proc.wait(timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        proc.kill()
