"""Target-token sampling that speculation cannot change.

Every verify row's target token is a pure function of (that row's logits, the sampling parameters, the
request seed, the absolute position of the token being drawn). The randomness is a counter-based hash of
(seed, position), not a stateful generator, so it does not matter which round, which row or how many rows
compute the token: plain decoding and any speculative schedule draw the same uniform for the same position
and, given the same logits, the same token. Each row is processed on its own as a 1-D tensor so the
floating-point work never depends on how many rows share a verify call; the rows of a call are stepped in
lockstep (`_drive`) so that their host read-backs go together: as many transfers as the row needing the most
steps (about 8), not about 9 per row.

A request may also adjust the logits before any of that (`elpis.spec.penalties`: repetition, frequency and
presence penalties over the tokens before the drawn one, then logit_bias); the adjusted row is what is drawn
from, greedy included.

Filter order (the vLLM order): temperature, top_k (ties kept by lowest id), top_p (over the top-k
renormalised distribution, sorted by probability with ties by lowest id, the smallest prefix reaching
top_p), min_p (relative to the most likely token). The kept tokens are sampled by inverse CDF in token-id
order, in float64. Only as much of the vocabulary is sorted as the filters need.
"""

from __future__ import annotations

import math
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

_T = TypeVar("_T")

_MASK64 = (1 << 64) - 1
MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class SamplingParams:
    """Sampling controls of one request. temperature 0 means greedy (argmax, lowest id on ties). The penalties
    and `logit_bias` (pairs of token id and bias) adjust each row's logits first (`elpis.spec.penalties`)."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = no top-k filter
    min_p: float = 0.0
    seed: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        if not (isinstance(self.temperature, int | float) and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be a finite number, got {self.temperature!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not (isinstance(self.top_p, int | float) and 0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 disables it), got {self.top_k!r}")
        if not (isinstance(self.min_p, int | float) and 0.0 <= self.min_p <= 1.0):
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not (_is_number(value) and -MAX_PENALTY <= value <= MAX_PENALTY):
                raise ValueError(f"{name} must be in [-{MAX_PENALTY:g}, {MAX_PENALTY:g}], got {value!r}")
        if not (_is_number(self.repetition_penalty) and 0.0 < self.repetition_penalty <= MAX_PENALTY):
            raise ValueError(f"repetition_penalty must be in (0, {MAX_PENALTY:g}], "
                             f"got {self.repetition_penalty!r}")
        _check_bias(self.logit_bias)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def adjusts_logits(self) -> bool:
        """Whether a row's logits are adjusted before the draw (then a greedy token is not the raw argmax)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                    or self.logit_bias)


MAX_PENALTY = 2.0
MAX_LOGIT_BIAS = 100.0


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _check_bias(pairs: object) -> None:
    """logit_bias: a tuple of (token id >= 0, bias in [-100, 100]) pairs, each id once."""
    if not isinstance(pairs, tuple):
        raise ValueError(f"logit_bias must be a tuple of (token id, bias) pairs, got {type(pairs).__name__}")
    seen: set[int] = set()
    for pair in pairs:
        if not (isinstance(pair, tuple) and len(pair) == 2):
            raise ValueError(f"logit_bias entries must be (token id, bias) pairs, got {pair!r}")
        token, bias = pair
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise ValueError(f"logit_bias token ids must be integers >= 0, got {token!r}")
        if token in seen:
            raise ValueError(f"logit_bias names token {token} twice")
        if not (_is_number(bias) and -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS):
            raise ValueError(f"logit_bias values must be in [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}], "
                             f"got {bias!r} for token {token}")
        seen.add(token)


def _mix64(x: int) -> int:
    """splitmix64's finaliser: a bijective avalanche on 64-bit integers."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK64
    return x ^ (x >> 31)


def position_uniform(seed: int, position: int) -> float:
    """A uniform in [0, 1) keyed by (request seed, absolute token position); 53 random bits."""
    if position < 0:
        raise ValueError(f"position must be >= 0, got {position}")
    key = _mix64((seed & _MASK64) ^ 0x9E3779B97F4A7C15)
    bits = _mix64((key + (position & _MASK64) * 0xD1B54A32D192ED03) & _MASK64)
    return (bits >> 11) * (1.0 / (1 << 53))


def greedy_ids(logits: torch.Tensor) -> torch.Tensor:
    """On the logits' device: the argmax of every row (lowest id on ties), -1 where the row's maximum is not
    finite. Exact, so rows may be reduced together; read back with `checked_greedy`."""
    if logits.dim() != 2:
        raise ValueError(f"expected logits [rows, vocab], got shape {tuple(logits.shape)}")
    ids = torch.argmax(logits, dim=1)
    best = logits.gather(1, ids.unsqueeze(1)).squeeze(1)
    return torch.where(torch.isfinite(best), ids, -1)


def checked_greedy(ids: Sequence[int]) -> list[int]:
    """The greedy tokens read back from `greedy_ids`, refusing a row whose maximum was not finite."""
    if any(i < 0 for i in ids):
        raise ValueError("logits contain a non-finite row maximum: the backend produced garbage")
    return [int(i) for i in ids]


def greedy_tokens(logits: torch.Tensor) -> list[int]:
    """Argmax of every row (lowest id on ties), in one read-back."""
    return checked_greedy(greedy_ids(logits).tolist())


# A row's sampler as steps: each yields the 0-d tensors whose values it needs next and receives them as
# Python floats (token ids and counts are exact in float64). `_drive` runs the samplers of every row of a
# verify in lockstep, reading all their values of a step in one transfer: one host synchronisation per step
# instead of one per value and row, while each row still runs its own 1-D operations in the same order.
Steps = Generator[list[torch.Tensor], list[float], _T]


def _drive(samplers: Sequence[Steps[_T]]) -> list[_T]:
    """Run every sampler to its end in lockstep; their results, in order."""
    results: list[Any] = [None] * len(samplers)
    asks: dict[int, list[torch.Tensor]] = {}
    for i, sampler in enumerate(samplers):
        try:
            asks[i] = next(sampler)
        except StopIteration as done:
            results[i] = done.value
    while asks:
        wanted = [t for i in asks for t in asks[i]]
        values = torch.stack([t.reshape(()).to(torch.float64) for t in wanted]).tolist()
        turn, asks, at = asks, {}, 0
        for i, asked in turn.items():
            got, at = values[at : at + len(asked)], at + len(asked)
            try:
                asks[i] = samplers[i].send(got)
            except StopIteration as done:
                results[i] = done.value
    return results


def _true_ids(mask: torch.Tensor, count: int, *, by_sort: bool | None = None) -> torch.Tensor:
    """The ids where `mask` holds, ascending (`torch.nonzero`'s result), given how many there are: on a GPU
    (`by_sort`) without nonzero's own host synchronisation, a stable sort putting them first in id order."""
    if not (mask.is_cuda if by_sort is None else by_sort):
        return torch.nonzero(mask).flatten()
    return torch.sort(mask.to(torch.uint8), descending=True, stable=True).indices[:count]


def _stable_top(probs: torch.Tensor, count: int) -> Steps[torch.Tensor]:
    """Ids of the `count` most likely tokens, most likely first, ties by lowest id: exactly the head of a
    stable descending sort, without sorting the whole vocabulary."""
    if count >= probs.shape[0]:
        return torch.sort(probs, descending=True, stable=True).indices
    threshold = torch.topk(probs, count, sorted=False).values.min()
    mask = probs >= threshold
    (size,) = yield [mask.sum()]
    candidates = _true_ids(mask, int(size))  # ascending ids, every tie included
    order = torch.sort(probs[candidates], descending=True, stable=True).indices
    return candidates[order][:count]


def _kept(row: torch.Tensor, params: SamplingParams) -> Steps[tuple[torch.Tensor, torch.Tensor]]:
    scaled = row.to(torch.float64) / params.temperature
    # torch.argmax takes NaN for the maximum, so a NaN anywhere shows up here; +inf is refused as well.
    top_t = torch.argmax(scaled)
    top, value = yield [top_t, scaled[top_t]]
    if not math.isfinite(value):
        raise ValueError(f"logits row has a non-finite maximum ({value}): the backend produced garbage")
    probs = torch.exp(scaled - scaled[int(top)])  # the most likely token has weight exactly 1
    vocab = probs.shape[0]
    if params.top_k or params.top_p < 1.0:
        limit = vocab if params.top_k == 0 else min(params.top_k, vocab)
        if params.top_p < 1.0:
            mass_t = probs.sum() if limit == vocab else probs[(yield from _stable_top(probs, limit))].sum()
            (mass,) = yield [mass_t]
            reach = params.top_p * mass
            # Widen the sorted head until it holds top_p of the mass (peaked rows stop at the first try).
            width = min(64, limit)
            while True:
                head = yield from _stable_top(probs, width)
                cumulative = torch.cumsum(probs[head], dim=0)
                (total,) = yield [cumulative[-1]]
                if total >= reach or width == limit:
                    break
                width = min(width * 8, limit)
            (first,) = yield [torch.searchsorted(cumulative, reach)]
            keep = min(width, int(first) + 1)  # the smallest prefix reaching top_p
            ids = head[:keep]
        else:
            ids = yield from _stable_top(probs, limit)
        ids = torch.sort(ids).values
    else:
        ids = torch.arange(vocab, device=row.device)
    weights = probs[ids]
    if params.min_p > 0.0:
        # Relative to the most likely token, whose weight is 1 (it survives every filter).
        chosen = weights >= params.min_p
        (size,) = yield [chosen.sum()]
        picked = _true_ids(chosen, int(size))
        ids, weights = ids[picked], weights[picked]
    return ids, weights


def _sample(row: torch.Tensor, params: SamplingParams, position: int) -> Steps[int]:
    ids, weights = yield from _kept(row, params)
    cdf = torch.cumsum(weights, dim=0)
    (total,) = yield [cdf[-1]]
    target = position_uniform(params.seed, position) * total
    found = torch.searchsorted(cdf, target, right=True)
    last = weights.shape[0] - 1
    at = found.clamp(max=last)
    index, weight, token = yield [found, weights[at], ids[at]]
    if int(index) > last or weight == 0.0:
        # target rounded up to the total: take the last token with weight.
        (index,) = yield [torch.nonzero(weights).max()]
        (token,) = yield [ids[int(index)]]
    return int(token)


def kept_distribution(row: torch.Tensor, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
    """The tokens the filters keep (ascending ids) and their unnormalised float64 weights."""
    return _drive([_kept(row, params)])[0]


def sample_row(row: torch.Tensor, params: SamplingParams, position: int) -> int:
    """The target token for one logits row drawn for absolute `position` under `params`."""
    if row.dim() != 1:
        raise ValueError(f"expected one logits row, got shape {tuple(row.shape)}")
    if params.greedy:
        return greedy_tokens(row.unsqueeze(0))[0]
    return _drive([_sample(row, params, position)])[0]


def sample_rows(logits: torch.Tensor, params: SamplingParams, positions: Sequence[int]) -> list[int]:
    """Target tokens of every row of a verify result; row r is drawn for absolute `positions[r]`. The rows'
    samplers run in lockstep (`_drive`): a handful of host transfers per call, not per row."""
    if logits.dim() != 2 or logits.shape[0] != len(positions):
        raise ValueError(f"logits shape {tuple(logits.shape)} does not match {len(positions)} positions")
    if params.greedy:
        return greedy_tokens(logits)
    return _drive([_sample(logits[r], params, positions[r]) for r in range(len(positions))])


def top_logprobs(row: torch.Tensor, token: int, count: int) -> tuple[int, float, list[tuple[int, float]]]:
    """(token, its log-probability, the `count` most likely (id, log-probability)) from the raw logits."""
    if not 0 <= count <= MAX_TOP_LOGPROBS:
        raise ValueError(f"top_logprobs must be in 0..{MAX_TOP_LOGPROBS}, got {count}")
    logprobs = torch.log_softmax(row.to(torch.float64), dim=0)
    alternatives: list[tuple[int, float]] = []
    if count:
        best = torch.topk(logprobs, min(count, logprobs.shape[0]))
        pairs = zip(best.indices.tolist(), best.values.tolist(), strict=True)
        alternatives = sorted(((int(i), float(v)) for i, v in pairs), key=lambda p: (-p[1], p[0]))
    return token, float(logprobs[token]), alternatives
