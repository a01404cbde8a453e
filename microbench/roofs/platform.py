"""Which code path the main job takes: the CPU's roofs, or an accelerator's (`--platform`).

`choose(requested, backend)` is pure: "auto" takes JAX's default backend; "gpu" or "tpu"
asked for on a CPU *forces* the accelerator path there, so its logic (device roofs, the Pallas
copy in interpret mode, the fp8 check, bfloat16 phases) runs and is tested without a device.
A forced run says so everywhere: its environment block carries `forced_platform`, which
machines.slug and machines.describe read, so its results live in their own folder and no
figure of it names a GPU. Asking for one accelerator on another, or for the CPU path on an
accelerator, is refused: those runs would measure one machine with another's programs.

What the device path did not measure, each result lists under `skipped` with why; the summary
prints them (`microbench.plots.summary.skipped_lines`).
"""

from __future__ import annotations

from dataclasses import dataclass

PLATFORMS = ("auto", "cpu", "gpu", "tpu")
ACCELERATORS = ("gpu", "tpu")


@dataclass(frozen=True)
class Platform:
    """The code path (`target`) and what JAX really runs on (`backend`)."""

    requested: str
    backend: str

    @property
    def target(self) -> str:
        return self.backend if self.requested == "auto" else self.requested

    @property
    def forced(self) -> bool:
        """An accelerator's path run on JAX's CPU backend (small sizes, Pallas interpreted)."""
        return self.target != self.backend

    @property
    def accelerator(self) -> bool:
        return self.target != "cpu"

    @property
    def interpret(self) -> bool:
        """Pallas kernels run in interpret mode: there is no device to compile them for."""
        return self.backend == "cpu"

    def to_dict(self) -> dict:
        return {"requested": self.requested, "backend": self.backend, "target": self.target,
                "forced": self.forced, "interpret": self.interpret}


def choose(requested: str, backend: str) -> Platform:
    """The path for `--platform requested` on JAX backend `backend`; ValueError naming the
    option, the value and what is allowed otherwise."""
    if requested not in PLATFORMS:
        raise ValueError(f"--platform {requested!r}: choose one of {', '.join(PLATFORMS)}")
    p = Platform(requested, backend)
    if p.forced and not (backend == "cpu" and p.target in ACCELERATORS):
        raise ValueError(
            f"--platform {requested!r}: JAX's backend here is {backend!r}; only an "
            f"accelerator's path ({', '.join(ACCELERATORS)}) can be forced, and only on the "
            "CPU backend (run with JAX_PLATFORMS=cpu for that), else use 'auto'")
    return p


def current(requested: str) -> Platform:
    """choose() against the backend JAX picks in this process."""
    import jax

    return choose(requested, jax.default_backend())


def environment(platform: Platform) -> dict:
    """harness.environment() plus the path taken: `platform` (its target) and, on a forced
    run, `forced_platform` (what machines.slug and describe read)."""
    from microbench import harness

    env = harness.environment()
    env["platform"] = platform.target
    env["forced_platform"] = platform.target if platform.forced else None
    return env


def machine_label(env: dict) -> str:
    """The `machine` field of a device-path result: the device, or the CPU and the forced path."""
    if env.get("forced_platform"):
        return (f"cpu: {env.get('cpu_model') or 'unknown'}, {len(env.get('affinity') or [])} "
                f"cores ({env['forced_platform']} path forced on this CPU)")
    return f"{env['backend']}: {env.get('device_kind')}"
