"""Serving metrics from recorded timestamps: what a user waits for, and what a run delivers.

Per request (a Timeline: arrival time and the time each output token was produced):

    TTFT   time to first token     token_times[0] - arrival     (queueing + prefill)
    ITL    inter-token latencies   diff(token_times)            (one per later token)
    TPOT   time per output token   (last - first) / (n - 1)     (the mean ITL; NaN if n = 1)
    E2E    end-to-end latency      token_times[-1] - arrival

Per run: p50/p90/p99 of each (numpy's linear interpolation between order statistics), output
token throughput, and goodput. Goodput follows DistServe (Zhong et al. 2024): a request
counts only if it meets both SLOs, TTFT <= ttft_slo and TPOT <= tpot_slo (a one-token request
has no TPOT and meets that SLO). Here `goodput` is such requests per second of the run, and
`slo_attainment` their fraction; DistServe's headline number, the highest request rate whose
attainment stays above a target (e.g. 90%), is read off a sweep of runs over rates.

A run's whole span includes its warm-up (the first requests find an empty server) and its
drain (the last ones finish after arrivals stop), so requests over the whole span is below the
offered rate even when every request is served at once. `steady` measures in a window instead:
the requests that arrived between the arrivals of the `trim` first and `trim` last ones.
Goodput there is the window's arrival rate times the fraction of its requests meeting both
SLOs (so it equals the offered rate when all meet them); throughput is the requests completed,
and the tokens produced, inside the window per second. At an overloaded rate the queue grows
through the window, so attainment falls with the run's length: no rate past saturation has a
steady state.
`completion_rate` is what a server sustains: requests completed per second between its
`trim` first and `trim` last completions, under a queue that never empties (e.g. every
request arriving at once).

Pool utilization is time-weighted: a sample (t, used, cached) holds until the next one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Timeline:
    """One request's arrival and output-token timestamps (seconds on one clock)."""

    arrival: float
    token_times: tuple[float, ...]

    def __post_init__(self):
        times = tuple(float(t) for t in self.token_times)
        object.__setattr__(self, "token_times", times)
        if not times:
            raise ValueError("token_times is empty: a timeline needs at least one token")
        if times[0] < self.arrival or any(np.diff(times) < 0):
            raise ValueError("token_times must be sorted and not before the arrival")

    @classmethod
    def of(cls, seq) -> Timeline:
        """From a scheduler Sequence (anything with .request.arrival and .token_times)."""
        return cls(seq.request.arrival, tuple(seq.token_times))

    @property
    def ttft(self) -> float:
        return self.token_times[0] - self.arrival

    @property
    def itl(self) -> np.ndarray:
        return np.diff(self.token_times)

    @property
    def tpot(self) -> float:
        n = len(self.token_times)
        return (self.token_times[-1] - self.token_times[0]) / (n - 1) if n > 1 else math.nan

    @property
    def e2e(self) -> float:
        return self.token_times[-1] - self.arrival

    def meets(self, ttft_slo: float, tpot_slo: float) -> bool:
        return self.ttft <= ttft_slo and (math.isnan(self.tpot) or self.tpot <= tpot_slo)


def percentiles(values, qs: Sequence[float] = (50, 90, 99)) -> dict[str, float]:
    """{"mean", "p50", "p90", "p99"} of the non-NaN values (all NaN when there are none)."""
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    if v.size == 0:
        return {"mean": math.nan, **{f"p{q:g}": math.nan for q in qs}}
    return {"mean": float(v.mean()), **{f"p{q:g}": float(np.percentile(v, q)) for q in qs}}


def duration(timelines: Sequence[Timeline]) -> float:
    """From the first arrival to the last token."""
    if not timelines:
        raise ValueError("timelines is empty: no requests to measure")
    return max(t.token_times[-1] for t in timelines) - min(t.arrival for t in timelines)


def _span(timelines, span: float | None) -> float:
    span = duration(timelines) if span is None else span
    if not span > 0:
        raise ValueError(f"duration={span!r}: must be > 0 to compute a rate")
    return span


def throughput(timelines: Sequence[Timeline], span: float | None = None) -> float:
    """Output tokens per second over `span` (default: the run's duration)."""
    return sum(len(t.token_times) for t in timelines) / _span(timelines, span)


def slo_attainment(timelines: Sequence[Timeline], ttft_slo: float, tpot_slo: float) -> float:
    """Fraction of requests meeting both SLOs."""
    if not timelines:
        raise ValueError("timelines is empty: no requests to measure")
    return sum(t.meets(ttft_slo, tpot_slo) for t in timelines) / len(timelines)


def goodput(timelines: Sequence[Timeline], ttft_slo: float, tpot_slo: float,
            span: float | None = None) -> float:
    """Requests per second that meet both SLOs (DistServe's goodput at this rate)."""
    ok = sum(t.meets(ttft_slo, tpot_slo) for t in timelines)
    return ok / _span(timelines, span)


def hit_rate(hit_tokens: int, miss_tokens: int) -> float:
    """Fraction of prompt tokens served from the prefix cache."""
    total = hit_tokens + miss_tokens
    return hit_tokens / total if total else 0.0


def utilization(usage: Sequence[tuple[float, int, int]], num_pages: int) -> dict[str, float]:
    """Time-weighted mean fraction of pages used, and used or cached, from (t, used, cached)
    samples; each holds until the next sample (a single sample is its own mean)."""
    if not usage:
        raise ValueError("usage is empty: record at least one (time, used, cached) sample")
    t, used, cached = np.asarray(usage, dtype=float).reshape(-1, 3).T
    w = np.diff(t)
    if w.sum() <= 0:
        w, used, cached = np.ones(1), used[-1:], cached[-1:]
    else:
        used, cached = used[:-1], cached[:-1]
    return {"used": float(np.average(used, weights=w) / num_pages),
            "held": float(np.average(used + cached, weights=w) / num_pages)}


def summarize(timelines: Sequence[Timeline], ttft_slo: float, tpot_slo: float,
              span: float | None = None) -> dict:
    """Every per-run number for one run's requests, as a JSON-ready dict."""
    span = _span(timelines, span)
    return {
        "requests": len(timelines),
        "duration_s": span,
        "ttft_s": percentiles([t.ttft for t in timelines]),
        "tpot_s": percentiles([t.tpot for t in timelines]),
        "itl_s": percentiles(np.concatenate([t.itl for t in timelines])),
        "e2e_s": percentiles([t.e2e for t in timelines]),
        "output_tokens_per_s": throughput(timelines, span),
        "requests_per_s": len(timelines) / span,
        "slo": {"ttft_s": ttft_slo, "tpot_s": tpot_slo},
        "slo_attainment": slo_attainment(timelines, ttft_slo, tpot_slo),
        "goodput_requests_per_s": goodput(timelines, ttft_slo, tpot_slo, span),
    }


def _trimmed(n: int, trim: float) -> int:
    if not 0 <= trim < 0.5:
        raise ValueError(f"trim={trim!r}: must be in [0, 0.5)")
    k = int(math.floor(n * trim))
    if n - 2 * k < 2:
        raise ValueError(f"{n} requests leave {n - 2 * k} after trimming {trim:g} at each end: "
                         "give more requests (at least 2 must remain)")
    return k


def steady(timelines: Sequence[Timeline], ttft_slo: float, tpot_slo: float,
           trim: float = 0.1) -> dict:
    """Goodput, SLO attainment and throughput in the steady-state window (module docstring):
    the requests whose arrival is not among the `trim` first or last."""
    order = sorted(timelines, key=lambda t: t.arrival)
    k = _trimmed(len(order), trim)
    kept = order[k:len(order) - k]
    start, end = kept[0].arrival, kept[-1].arrival
    if not end > start:
        raise ValueError("the window's requests all arrive at once: a steady-state window "
                         "needs a finite arrival rate (use completion_rate)")
    span = end - start
    rate = (len(kept) - 1) / span  # the window's arrival rate: its gaps' mean, inverted
    met = sum(t.meets(ttft_slo, tpot_slo) for t in kept)
    done = sum(start <= t.token_times[-1] <= end for t in timelines)
    tokens = sum(int(np.sum((np.asarray(t.token_times) >= start)
                            & (np.asarray(t.token_times) <= end))) for t in timelines)
    return {"trim": trim, "start_s": start, "end_s": end, "window_s": span,
            "requests": len(kept), "arrival_rate": rate,
            "slo_attainment": met / len(kept),
            "goodput_requests_per_s": rate * met / len(kept),
            "completed_requests_per_s": done / span, "output_tokens_per_s": tokens / span,
            "ttft_s": percentiles([t.ttft for t in kept]),
            "tpot_s": percentiles([t.tpot for t in kept])}


def completion_rate(timelines: Sequence[Timeline], trim: float = 0.1) -> float:
    """Requests completed per second between the `trim` first and `trim` last completions:
    the rate a server sustains when its queue never empties."""
    done = np.sort([t.token_times[-1] for t in timelines])
    k = _trimmed(len(done), trim)
    span = done[len(done) - k - 1] - done[k]
    if not span > 0:
        raise ValueError("the window's requests all complete at once: no rate to measure")
    return float((len(done) - 2 * k - 1) / span)
