"""Seeded, file-free workloads: lists of Requests with arrival times, generated here.

Arrivals are a renewal process at `rate` requests/s: gaps drawn from a gamma distribution
with mean 1/rate and coefficient of variation `cv`. cv = 1 is a Poisson process (exponential
gaps), the usual model of independent users; cv > 1 is bursty (clumps of requests, then
lulls), as production traces are. rate = inf puts every request at t = 0 (an offline batch).
The first request arrives at t = 0.

Lengths are lognormal with the given mean and log-space spread `spread` (0: all equal),
rounded and clipped to >= 1: real prompt and output lengths are long-tailed.

Shapes of traffic where prefix caching matters (SGLang, Zheng et al. 2024, measured these):

    random_requests  independent prompts: the no-sharing baseline
    shared_prefix    one system prompt before every user prompt (chat products, agents)
    multi_turn       conversations whose every turn resends the whole history so far
    few_shot         a few task prefixes of worked examples, each followed by a question
    chat_like        ShareGPT's prompt and output lengths (as the vLLM paper reports them),
                     scaled down, after an optional shared system prompt

Token ids are uniform in [0, vocab). Request ids follow arrival order.
"""

from __future__ import annotations

import math

import numpy as np

from refmodel.serving.request import Request


def _check(name: str, value, minimum: float = 1, strict: bool = False) -> None:
    if not (value > minimum if strict else value >= minimum) or value != value:
        bound = f"> {minimum}" if strict else f">= {minimum}"
        raise ValueError(f"{name}={value!r}: must be {bound}")


def arrivals(rng: np.random.Generator, n: int, rate: float, cv: float = 1.0) -> np.ndarray:
    """n arrival times [s], starting at 0, at `rate` per second with gap variation `cv`."""
    _check("n", n)
    _check("rate", rate, 0, strict=True)
    _check("cv", cv, 0, strict=True)
    if math.isinf(rate):
        return np.zeros(n)
    gaps = rng.gamma(shape=1 / cv**2, scale=cv**2 / rate, size=n - 1)  # mean 1/rate
    return np.concatenate([[0.0], np.cumsum(gaps)])


def lengths(rng: np.random.Generator, n: int, mean: float, spread: float = 0.5,
            name: str = "length") -> np.ndarray:
    """n lognormal integer lengths >= 1 with the given mean (spread = sigma of the log)."""
    _check(name, mean)
    _check(f"{name} spread", spread, 0)
    mu = math.log(mean) - spread**2 / 2  # so that E[exp(N(mu, spread^2))] = mean
    return np.maximum(1, np.rint(rng.lognormal(mu, spread, size=n))).astype(int)


def _tokens(rng: np.random.Generator, n: int, vocab: int) -> tuple[int, ...]:
    return tuple(int(t) for t in rng.integers(0, vocab, size=n))


def _requests(items: list[tuple[float, tuple[int, ...], int]]) -> list[Request]:
    """(arrival, prompt, max_new_tokens) triples -> Requests numbered in arrival order."""
    items = sorted(items, key=lambda x: x[0])
    return [Request(i, p, int(m), float(t)) for i, (t, p, m) in enumerate(items)]


def random_requests(n: int, rate: float, prompt_len: float = 128, output_len: float = 64,
                    vocab: int = 1000, seed: int = 0, cv: float = 1.0,
                    spread: float = 0.5) -> list[Request]:
    """Independent random prompts."""
    _check("vocab", vocab, 2)
    rng = np.random.default_rng(seed)
    t = arrivals(rng, n, rate, cv)
    p = lengths(rng, n, prompt_len, spread, "prompt_len")
    o = lengths(rng, n, output_len, spread, "output_len")
    return _requests([(t[i], _tokens(rng, p[i], vocab), o[i]) for i in range(n)])


def shared_prefix(n: int, rate: float, system_len: int = 512, prompt_len: float = 64,
                  output_len: float = 64, vocab: int = 1000, seed: int = 0, cv: float = 1.0,
                  spread: float = 0.5) -> list[Request]:
    """One system prompt of `system_len` tokens, then each request's own user prompt."""
    _check("system_len", system_len)
    _check("vocab", vocab, 2)
    rng = np.random.default_rng(seed)
    system = _tokens(rng, system_len, vocab)
    t = arrivals(rng, n, rate, cv)
    p = lengths(rng, n, prompt_len, spread, "prompt_len")
    o = lengths(rng, n, output_len, spread, "output_len")
    return _requests([(t[i], system + _tokens(rng, p[i], vocab), o[i]) for i in range(n)])


def multi_turn(conversations: int, turns: int, rate: float, user_len: float = 64,
               output_len: float = 64, think_time: float = 5.0, vocab: int = 1000,
               seed: int = 0, spread: float = 0.5) -> list[Request]:
    """Conversations starting at `rate` (Poisson); turn k's prompt is turn k-1's prompt, a
    reply of turn k-1's output length, and a new user message. Open loop: turn k arrives an
    exponential `think_time` after turn k-1 arrived, finished or not. The stand-in reply is
    random, so a real engine's cached reply will not match it: the hit is the previous
    prompt, as when a client edits or regenerates the reply."""
    _check("conversations", conversations)
    _check("turns", turns)
    _check("think_time", think_time, 0)
    _check("vocab", vocab, 2)
    rng = np.random.default_rng(seed)
    items = []
    for start in arrivals(rng, conversations, rate):
        history, t = (), float(start)
        for k in range(turns):
            if k:
                t += float(rng.exponential(think_time)) if think_time else 0.0
                history += _tokens(rng, items[-1][2], vocab)  # the reply to the last turn
            history += _tokens(rng, int(lengths(rng, 1, user_len, spread, "user_len")[0]),
                               vocab)
            items.append((t, history, int(lengths(rng, 1, output_len, spread,
                                                  "output_len")[0])))
    return _requests(items)


def few_shot(n: int, rate: float, shots: int = 5, shot_len: float = 100,
             question_len: float = 50, output_len: float = 32, tasks: int = 1,
             vocab: int = 1000, seed: int = 0, cv: float = 1.0,
             spread: float = 0.5) -> list[Request]:
    """`tasks` prefixes of `shots` worked examples each; every request picks a task at
    random and appends its own question."""
    for name, value in [("shots", shots), ("tasks", tasks)]:
        _check(name, value)
    _check("vocab", vocab, 2)
    rng = np.random.default_rng(seed)
    prefixes = [sum((_tokens(rng, k, vocab) for k in lengths(rng, shots, shot_len, spread,
                                                             "shot_len")), ())
                for _ in range(tasks)]
    t = arrivals(rng, n, rate, cv)
    q = lengths(rng, n, question_len, spread, "question_len")
    o = lengths(rng, n, output_len, spread, "output_len")
    task = rng.integers(0, tasks, size=n)
    return _requests([(t[i], prefixes[task[i]] + _tokens(rng, q[i], vocab), o[i])
                      for i in range(n)])


# ShareGPT (conversations users shared with ChatGPT) is the trace the serving papers take their
# chat lengths from. Kwon et al. 2023 (vLLM, "Efficient Memory Management for Large Language
# Model Serving with PagedAttention", Fig. 11): mean input 161.31 tokens, mean output 337.99
# tokens, 8.4x and 5.8x Alpaca's, "with higher variance". vLLM's serving benchmark keeps the
# pairs with 4 <= prompt <= 1024 and prompt + output <= 2048 tokens (sample_sharegpt_requests).
SHAREGPT = {"input_mean": 161.31, "output_mean": 337.99, "max_prompt": 1024, "max_total": 2048,
            "source": "Kwon et al. 2023 (vLLM), Fig. 11; vLLM benchmark_serving.py's filter"}
# The paper gives means and a histogram, not a spread: sigma = sqrt(ln 2) of the log length
# makes the standard deviation equal the mean (coefficient of variation 1; median = 0.71 x
# mean), a long tail like the histogram's. A stated choice, not a published moment.
CHAT_SPREAD = math.sqrt(math.log(2))


def chat_lengths(rng: np.random.Generator, n: int, scale: float = 1.0,
                 spread: float = CHAT_SPREAD) -> tuple[np.ndarray, np.ndarray]:
    """n (prompt, output) length pairs: lognormal with ShareGPT's means x `scale` and log
    spread `spread`, each pair kept only if it passes vLLM's filter scaled the same way
    (prompt <= 1024 x scale, prompt + output <= 2048 x scale; both >= 1), else redrawn."""
    _check("scale", scale, 0, strict=True)
    _check("spread", spread, 0)
    cap_prompt = max(1, int(SHAREGPT["max_prompt"] * scale))
    cap_total = max(2, int(SHAREGPT["max_total"] * scale))
    prompts, outputs = [], []
    while len(prompts) < n:
        k = 2 * (n - len(prompts)) + 8
        p = lengths(rng, k, SHAREGPT["input_mean"] * scale, spread, "prompt_len")
        o = lengths(rng, k, SHAREGPT["output_mean"] * scale, spread, "output_len")
        keep = (p <= cap_prompt) & (p + o <= cap_total)
        prompts += p[keep].tolist()
        outputs += o[keep].tolist()
    return np.array(prompts[:n]), np.array(outputs[:n])


def chat_like(n: int, rate: float, scale: float = 1.0, system_len: int = 0,
              spread: float = CHAT_SPREAD, vocab: int = 1000, seed: int = 0,
              cv: float = 1.0) -> list[Request]:
    """Independent chat requests with ShareGPT's lengths x `scale` (chat_lengths), each after
    the same `system_len`-token system prompt (0: none). The arrivals come from their own
    random stream: at any rate (inf included) the same seed gives the same requests, in the
    same order, only their arrival times differ."""
    _check("system_len", system_len, 0)
    _check("vocab", vocab, 2)
    _check("n", n)
    rng = np.random.default_rng(seed)
    system = _tokens(rng, int(system_len), vocab)
    p, o = chat_lengths(rng, n, scale, spread)
    t = arrivals(np.random.default_rng([seed, 1]), n, rate, cv)
    return _requests([(t[i], system + _tokens(rng, p[i], vocab), o[i]) for i in range(n)])
