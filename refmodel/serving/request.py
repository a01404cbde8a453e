"""What travels between client, scheduler and engine.

A Request (client -> scheduler) is immutable: an id, prompt token ids, how many tokens to
generate, and when it arrives (seconds on the run's clock). A Sequence (nano-vllm's
`sequence.py`) is the scheduler's state of one: the tokens so far (prompt + output),
`computed`, how many of them have KV in the pool, the prefix it borrowed from the radix cache,
and when each output token was produced. A Plan (scheduler -> engine) is one step's work:
Chunks of tokens to feed each sequence at given positions, and which of them sample a token.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

from refmodel.serving.pool import integer
from refmodel.serving.radix import Match


@dataclass(frozen=True)
class Request:
    id: int
    prompt: tuple[int, ...]
    max_new_tokens: int
    arrival: float = 0.0

    def __post_init__(self):
        """Each field checked here, at construction: an error names the request, the field,
        the value and what is allowed (a float token id is refused, not truncated)."""
        object.__setattr__(self, "id", integer("Request id", self.id, minimum=None))
        object.__setattr__(self, "prompt", _token_ids(self.id, self.prompt))
        object.__setattr__(self, "max_new_tokens",
                           integer(f"request {self.id}: max_new_tokens", self.max_new_tokens))
        a = self.arrival
        if isinstance(a, bool) or not isinstance(a, numbers.Real) or not math.isfinite(a) \
                or a < 0:
            raise ValueError(f"request {self.id}: arrival={a!r} must be a finite number of "
                             "seconds >= 0")
        object.__setattr__(self, "arrival", float(a))


def _token_ids(rid, prompt) -> tuple[int, ...]:
    """The prompt as a tuple of ints, each checked: an integer (not a bool, a float or a
    string) >= 0 (the engine checks the upper end against its model's vocabulary)."""
    if isinstance(prompt, (str, bytes)) or not hasattr(prompt, "__iter__"):
        raise ValueError(f"request {rid}: prompt={prompt!r:.60} must be a sequence of integer "
                         "token ids")
    ids = tuple(prompt)
    if not ids:
        raise ValueError(f"request {rid}: prompt is empty; give at least one token")
    for i, t in enumerate(ids):
        if type(t) is not int and (isinstance(t, bool) or not isinstance(t, numbers.Integral)):
            raise ValueError(f"request {rid}: prompt[{i}]={t!r} ({type(t).__name__}) is not a "
                             "token id: give integers >= 0")
        if t < 0:
            raise ValueError(f"request {rid}: prompt[{i}]={t} is a negative token id: give "
                             "integers >= 0")
    return tuple(int(t) for t in ids)


@dataclass(eq=False)
class Sequence:
    """A request's running state; `token_times[i]` is when output token i was produced."""

    request: Request
    tokens: list[int]
    computed: int = 0
    match: Match | None = None
    token_times: list[float] = field(default_factory=list)
    preemptions: int = 0

    @property
    def id(self) -> int:
        return self.request.id

    @property
    def output(self) -> list[int]:
        return self.tokens[len(self.request.prompt):]

    @property
    def pending(self) -> int:
        return len(self.tokens) - self.computed

    @property
    def decoding(self) -> bool:
        return len(self.tokens) > len(self.request.prompt) and self.pending == 1


@dataclass(frozen=True)
class Chunk:
    """Feed `tokens` to sequence `seq` at positions start, start+1, ...; `samples`: the last
    position's logits give the sequence's next token."""

    seq: int
    start: int
    tokens: tuple[int, ...]
    samples: bool


@dataclass
class Plan:
    """One step's work: prefill chunks and one-token decodes, plus who was preempted."""

    step: int
    prefill: list[Chunk] = field(default_factory=list)
    decode: list[Chunk] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(len(c.tokens) for c in self.prefill) + len(self.decode)

    @property
    def samples(self) -> list[int]:
        """Sequence ids whose next token this step produces."""
        return [c.seq for c in self.prefill + self.decode if c.samples]
