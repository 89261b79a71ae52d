"""Target-token sampling that speculation cannot change.

Every verify row's target token is a pure function of (that row's logits, the sampling parameters, the
request seed, the absolute position of the token being drawn). The randomness is a counter-based hash of
(seed, position), not a stateful generator, so it does not matter which round, which row or how many rows
compute the token: plain decoding and any speculative schedule draw the same uniform for the same position
and, given the same logits, the same token.

The rows of a verify are processed together (one selection and one scan for all of them; session 51 measured
the earlier row-by-row sampler at ~0.9 ms a row on an H100, 14.4 ms for 16 rows), and every step is exact
whatever rows stand beside a row, so a row draws what it draws alone: correctly rounded elementwise
operations, the exp row by row, selections by value with ties by lowest id, and weights summed in fixed point
(w counts as floor(w * 2^44), integers whose sums do not depend on their order). A row costs a handful of
host transfers, shared by all the rows of a call.

A request may also adjust the logits before any of that (`elpis.spec.penalties`: repetition, frequency and
presence penalties over the tokens before the drawn one, then logit_bias); the adjusted row is what is drawn
from, greedy included.

Filter order (the vLLM order): temperature, top_k (ties kept by lowest id), top_p (over the top-k
renormalised distribution, sorted by probability with ties by lowest id, the smallest prefix whose fixed-point
weights reach top_p of theirs), min_p (relative to the most likely token, whose weight is exactly 1). The kept
tokens are sampled by inverse CDF in token-id order over their fixed-point weights, exactly; a token under
2^-44 of the most likely one's weight is never drawn. With top_k, only its head is ranked, on the host; top_p
without top_k ranks the whole vocabulary with one stable sort on the device and finds its prefix by an exact
integer search (session 52: 9.1 ms for 16 rows on an H100 when the head was widened on the host). A backend's
device draws (`use_device_draw`, `use_vocab_draw`) take the same steps on the same values where installed.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction

import torch

MASK64 = (1 << 64) - 1
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
    def inverse_temperature(self) -> float:
        """1 / temperature, what each logit is multiplied by (not divided: a product by the same double is one
        correctly rounded operation on every device, whether the factor is a Python float or a float64 tensor
        in device memory, which a captured graph reads; torch on a GPU divides by a scalar this way too)."""
        return 1.0 / self.temperature

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
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & MASK64
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & MASK64
    return x ^ (x >> 31)


def position_uniform(seed: int, position: int) -> float:
    """A uniform in [0, 1) keyed by (request seed, absolute token position); 53 random bits."""
    if position < 0:
        raise ValueError(f"position must be >= 0, got {position}")
    key = _mix64((seed & MASK64) ^ 0x9E3779B97F4A7C15)
    bits = _mix64((key + (position & MASK64) * 0xD1B54A32D192ED03) & MASK64)
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


# The draw. Every step is exact whatever the rows beside a row, so the rows of a verify are processed together
# (one selection, one scan for all of them, not one after another) and a row still draws what it draws alone:
# correctly rounded elementwise operations, per-row exp (`_weights`), selections by value, and sums of weights
# in fixed point (integers, whose sums do not depend on their order).
FIXED_BITS = 44  # a weight w in [0, 1] counts as floor(w * 2^44); 248,320 of them sum below 2^62


_FIXED_SCALE = float(1 << FIXED_BITS)  # what `w * (1 << FIXED_BITS)` converts the int to anyway


def _fixed(w: float) -> int:
    return math.floor(w * _FIXED_SCALE)


def _fixed_weights(w: torch.Tensor) -> torch.Tensor:
    """`_fixed` of every weight, int64 (the same exact operations on the device)."""
    return torch.floor(w * (1 << FIXED_BITS)).to(torch.int64)


def _draw_target(seed: int, position: int, total: int) -> int:
    """floor(u * total) for the position's uniform u = k / 2^53, exactly: an inverse CDF over integer weights
    takes the first token whose cumulative weight passes it."""
    return (int(position_uniform(seed, position) * (1 << 53)) * total) >> 53


def _row_exp(x: torch.Tensor) -> torch.Tensor:
    """exp of every element, row by row on the CPU: there a vectorised exp and its scalar tail may round
    differently, and where a row's elements fall between them must not depend on the rows beside it. One
    launch on a GPU, whose elementwise exp is the same instructions at every position."""
    if x.is_cuda:
        return torch.exp(x)
    return torch.stack([torch.exp(x[r]) for r in range(x.shape[0])])


def _weights(logits: torch.Tensor, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
    """(w, best): every row's weights exp(x * (1/T) - max) in float64, the most likely token weighing exactly
    1, and each row's max of x * (1/T) (NaN or infinite: the row is garbage)."""
    scaled = logits.to(torch.float64) * params.inverse_temperature
    # torch.argmax takes NaN for the maximum, so a NaN anywhere shows up in `best`; +inf does as well.
    top = torch.argmax(scaled, dim=1, keepdim=True)
    best = scaled.gather(1, top)
    return _row_exp(scaled - best), best.squeeze(1)


def check_finite(best: list[float]) -> None:
    """Refuse rows whose maximum (of x * (1/T)) is NaN or infinite: the backend produced garbage."""
    for value in best:
        if not math.isfinite(value):
            raise ValueError(f"logits row has a non-finite maximum ({value}): the backend produced garbage")


def _candidates(w: torch.Tensor, width: int) -> list[list[tuple[float, int]]]:
    """Per row, (w, id) of every token at least as likely as its `width`-th most likely one (the head and all
    ties at its edge), ordered most likely first, ties by lowest id: exactly the head of a stable descending
    sort, without sorting the vocabulary. Tokens of weight 0 are left out: no draw reaches them, and a row a
    grammar masks to fewer than `width` tokens would otherwise tie its whole vocabulary at the edge."""
    edge = torch.topk(w, width, dim=1).values[:, -1:]
    mask = (w >= edge) & (w > 0)
    where = torch.nonzero(mask)  # (row, id), row-major, ids ascending
    table = torch.stack([where[:, 0].to(torch.float64), where[:, 1].to(torch.float64), w[mask]]).tolist()
    out: list[list[tuple[float, int]]] = [[] for _ in range(w.shape[0])]
    for row, token, weight in zip(*table, strict=True):
        out[int(row)].append((weight, int(token)))
    for ranked in out:
        ranked.sort(key=lambda pair: (-pair[0], pair[1]))
    return out


# A top_k head is read from the row's TOP_PAD + top_k largest logits alone where that is exact: each weight is
# the same elementwise float64 operations on the same value wherever it is computed, and a token outside those
# logits weighs at most the smallest weight among them within exp's rounding (<= 1 ulp; the subtraction before
# it rounds monotonically). So when the head's edge weight clears that smallest weight by EDGE_GAP (far more
# than two ulps), no token outside reaches the edge and the head is the whole vocabulary's. When that smallest
# weight is 0 (a row a grammar masks to fewer tokens than read), every token outside weighs 0 too, and the
# head is the tokens read of weight above 0 (`_candidates` leaves zeros out). Otherwise (ties across the edge)
# the whole vocabulary's weights decide.
TOP_PAD = 16
EDGE_GAP = 2.0**-40


@dataclass(frozen=True)
class TopWeights:
    """Each row's width + TOP_PAD largest logits as weights: `best` float64 [rows] the row's max of x * (1/T),
    `w` float64 [rows, count] exp(x * (1/T) - best) in topk's order, `ids` int64 [rows, count] their token
    ids, and the row width `vocab`."""

    best: torch.Tensor
    w: torch.Tensor
    ids: torch.Tensor
    vocab: int


def top_weights(logits: torch.Tensor, params: SamplingParams, width: int,
                scale: torch.Tensor | None = None) -> TopWeights:
    """The weights a top_k head is read from, on the logits' device (`_top_candidates` on the host, or a
    backend's device draw: the same tensors either way). `scale`: the inverse temperature as a float64
    tensor of one element on the logits' device (a captured graph's, read when it runs) in place of
    `params.inverse_temperature`; the products are the same."""
    vocab = logits.shape[1]
    count = min(vocab, width + TOP_PAD)
    # topk ranks NaN above everything, so a NaN anywhere in a row becomes its maximum, as argmax does
    top = torch.topk(logits, count, dim=1)
    factor = params.inverse_temperature if scale is None else scale
    scaled = top.values.to(torch.float64) * factor
    best = scaled[:, :1]
    # contiguous, as the device draw reads them
    return TopWeights(best.squeeze(1).contiguous(), _row_exp(scaled - best), top.indices, vocab)


def _top_candidates(logits: torch.Tensor, params: SamplingParams, width: int,
                    top: TopWeights | None = None) -> list[list[tuple[float, int]]] | None:
    """`_candidates` of the rows' weights, read from each row's width + TOP_PAD largest logits (`top`, when
    the caller has them already) in one transfer; None when some row's edge does not clear the smallest of
    those weights and that weight is not 0 (see TOP_PAD). A non-finite row maximum is refused as in
    `_weights`."""
    if top is None:
        top = top_weights(logits, params, width)
    vocab, count = top.vocab, top.w.shape[1]
    # -w and the ids (exact in float64) read back as (-w, id) tuples, whose plain ascending sort is the order
    # wanted (most likely first, ties by lowest id) without a key function: the sort is most of a call's time.
    table = torch.cat([top.best.unsqueeze(1), top.w.neg(), top.ids.to(torch.float64)], dim=1).tolist()
    check_finite([row[0] for row in table])
    out: list[list[tuple[float, int]]] = []
    for row in table:
        ranked = sorted(zip(row[1 : 1 + count], row[1 + count :], strict=True))
        edge, floor = -ranked[width - 1][0], -ranked[-1][0]
        if count < vocab and floor > 0.0 and not edge > floor * (1.0 + EDGE_GAP):
            return None
        # the tokens at least as likely as the edge are a prefix; weight 0 (-w = -0.0) is left out
        head = ranked[: bisect.bisect_right(ranked, (-edge, math.inf))]
        out.append([(-negative, int(token)) for negative, token in head if negative < 0.0])
    return out


def _nucleus(ranked: list[tuple[float, int]], top_p: Fraction) -> list[tuple[float, int]] | None:
    """The smallest prefix of `ranked` whose fixed-point weights reach top_p of all of theirs (exact), or
    None when all of `ranked` does not."""
    fixed = [_fixed(weight) for weight, _ in ranked]
    # an integer total reaches top_p * mass exactly when it reaches its ceiling: one rational product a row
    reach = math.ceil(top_p * sum(fixed))
    total = 0
    for n, q in enumerate(fixed, start=1):
        total += q
        if total >= reach:
            return ranked[:n]
    return None


def _heads(logits: torch.Tensor, params: SamplingParams,
           top: TopWeights | None = None) -> list[list[tuple[float, int]]]:
    """Each row's tokens after top_k and top_p, as ranked (w, id): top_k's head, then top_p over it (`top`:
    the rows' top weights, when the caller has them already)."""
    width = min(params.top_k, logits.shape[1])
    candidates = _top_candidates(logits, params, width, top)
    if candidates is None:  # some row's edge is not clear of its largest logits: every weight decides
        w, best = _weights(logits, params)
        check_finite(best.tolist())
        candidates = _candidates(w, width)
    heads = [ranked[: params.top_k] for ranked in candidates]
    if params.top_p == 1.0:
        return heads
    top_p = Fraction(params.top_p)
    return [_whole(_nucleus(head, top_p)) for head in heads]


def _whole(head: list[tuple[float, int]] | None) -> list[tuple[float, int]]:
    """A nucleus taken over a head that holds the whole mass (it always reaches top_p <= 1 of it)."""
    if head is None:
        raise AssertionError("a head holding the whole mass did not reach top_p of it")
    return head


def _exact_sums(values: torch.Tensor) -> torch.Tensor:
    """Non-negative int64 sums below 2^62 as two float64 rows (high and low 26 bits), exact, to be read back
    beside float64 values in one transfer; `_joined` puts them together again."""
    return torch.stack([(values >> 26).to(torch.float64), (values & ((1 << 26) - 1)).to(torch.float64)])


def _joined(high: list[float], low: list[float]) -> list[int]:
    return [(int(h) << 26) | int(lo) for h, lo in zip(high, low, strict=True)]


def _draw(kept: list[tuple[int, int]], seed: int, position: int) -> int:
    """Inverse CDF over (id, fixed-point weight) in id order, exactly: the first token whose cumulative weight
    passes u * total, u = k / 2^53 the position's uniform."""
    target = _draw_target(seed, position, sum(q for _, q in kept))
    cumulative = 0
    for token, q in kept:
        cumulative += q
        if cumulative > target:
            return token
    raise AssertionError("a draw below the total passed every token")


def _kept_lists(logits: torch.Tensor, params: SamplingParams,
                top: TopWeights | None = None) -> list[list[tuple[int, int]]]:
    """Per row, the kept (id, fixed-point weight) in id order under a top_k filter (top_p and min_p within
    its head): a few dozen tokens, drawn from on the host (`top` as in `_heads`)."""
    heads = _heads(logits, params, top)
    return [sorted((token, _fixed(x)) for x, token in head if x >= params.min_p) for head in heads]


def _read_sums(best: torch.Tensor, sums: torch.Tensor) -> list[int]:
    """Each row's exact int64 sum, read in one transfer with its maximum (a non-finite maximum refused)."""
    read = torch.cat([best.unsqueeze(0), _exact_sums(sums)]).tolist()
    check_finite(read[0])
    return _joined(read[1], read[2])


def _kept_fixed(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """int64 [rows, vocab]: each token's fixed-point weight where the filters keep it, else 0, without top_k
    (which `_kept_lists` serves). top_p ranks the whole vocabulary by (weight descending, id) with a stable
    sort and keeps the smallest prefix whose fixed-point weights reach top_p of the row's, found by an exact
    integer search: the same tokens as `_nucleus` over the same ranking."""
    w, best = _weights(logits, params)
    fixed = _fixed_weights(w)
    if params.top_p < 1.0:
        order = torch.sort(w, dim=1, descending=True, stable=True).indices
        cumulative = torch.cumsum(fixed.gather(1, order), dim=1)
        masses = _read_sums(best, cumulative[:, -1])
        # total >= top_p * mass  <=>  total >= ceil(top_p * mass): an integer, compared exactly on the device
        reach = [math.ceil(Fraction(params.top_p) * mass) for mass in masses]
        wanted = torch.tensor(reach, dtype=torch.int64, device=w.device).unsqueeze(1)
        counts = torch.searchsorted(cumulative, wanted) + 1  # the first prefix reaching it, ends included
        ranks = torch.arange(w.shape[1], device=w.device).unsqueeze(0)
        keep = torch.zeros_like(fixed, dtype=torch.bool).scatter_(1, order, ranks < counts)
        fixed = torch.where(keep, fixed, 0)
    else:
        check_finite(best.tolist())
    if params.min_p > 0.0:
        fixed = torch.where(w >= params.min_p, fixed, 0)
    return fixed


def _fixed_draws(fixed: torch.Tensor, params: SamplingParams, positions: Sequence[int]) -> list[int]:
    """Draws over each row's kept fixed-point weights (`_kept_fixed`) in id order: scanned on the device,
    each row's uniform placed by an exact search."""
    cumulative = torch.cumsum(fixed, dim=1)
    read = _exact_sums(cumulative[:, -1]).tolist()
    totals = _joined(read[0], read[1])
    targets = [_draw_target(params.seed, p, total) for p, total in zip(positions, totals, strict=True)]
    wanted = torch.tensor(targets, dtype=torch.int64, device=fixed.device).unsqueeze(1)
    return [int(i) for i in torch.searchsorted(cumulative, wanted, right=True).squeeze(1).tolist()]


def kept_distribution(row: torch.Tensor, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
    """The tokens the filters keep (ascending ids) and their fixed-point weights (int64, FIXED_BITS)."""
    logits = row.unsqueeze(0)
    if params.top_k:
        kept = _kept_lists(logits, params)[0]
        ids = [token for token, _ in kept]
        weights = [q for _, q in kept]
        return torch.tensor(ids, dtype=torch.long), torch.tensor(weights, dtype=torch.int64)
    fixed = _kept_fixed(logits, params)[0].cpu()
    ids_t = torch.nonzero(fixed).flatten()
    return ids_t, fixed[ids_t]


# A backend may draw a top_k request's rows on its device from the same `TopWeights`
# (elpis.exl3.sample_draw, registry switch exl3-sample-draw): the same steps on the same values, so the same
# tokens. It answers None where the host should decide (an edge tied past the weights read, or more weights
# than it takes).
DeviceDraw = Callable[[TopWeights, SamplingParams, Sequence[int]], "list[int] | None"]
_device_draw: DeviceDraw | None = None


def use_device_draw(draw: DeviceDraw | None) -> None:
    """Install (or, with None, remove) the device draw for rows on a CUDA device."""
    global _device_draw
    _device_draw = draw


# A backend may also draw a request without top_k on its device (elpis.exl3.vocab_draw, registry switch
# exl3-vocab-draw) from the logits themselves: the same operations on the same values. It answers None where
# the host should decide (a top_p prefix running past the weights it reads, or rows it does not read).
VocabDraw = Callable[[torch.Tensor, SamplingParams, Sequence[int]], "list[int] | None"]
_vocab_draw: VocabDraw | None = None


def use_vocab_draw(draw: VocabDraw | None) -> None:
    """Install (or, with None, remove) the device draw without top_k for rows on a CUDA device."""
    global _vocab_draw
    _vocab_draw = draw


def sample_row(row: torch.Tensor, params: SamplingParams, position: int) -> int:
    """The target token for one logits row drawn for absolute `position` under `params`."""
    if row.dim() != 1:
        raise ValueError(f"expected one logits row, got shape {tuple(row.shape)}")
    return sample_rows(row.unsqueeze(0), params, [position])[0]


def sample_rows(logits: torch.Tensor, params: SamplingParams, positions: Sequence[int]) -> list[int]:
    """Target tokens of every row of a verify result; row r is drawn for absolute `positions[r]`. The rows are
    processed together, each step exact whatever the rows beside it: a row draws what it draws alone."""
    if logits.dim() != 2 or logits.shape[0] != len(positions):
        raise ValueError(f"logits shape {tuple(logits.shape)} does not match {len(positions)} positions")
    if params.greedy:
        return greedy_tokens(logits)
    if not params.top_k:
        if _vocab_draw is not None and logits.is_cuda:
            drawn = _vocab_draw(logits, params, positions)
            if drawn is not None:
                return drawn
        return _fixed_draws(_kept_fixed(logits, params), params, positions)
    top = None
    if _device_draw is not None and logits.is_cuda:
        top = top_weights(logits, params, min(params.top_k, logits.shape[1]))
        drawn = _device_draw(top, params, positions)
        if drawn is not None:
            return drawn
    lists = _kept_lists(logits, params, top)  # a declined device draw's weights are the host's too
    return [_draw(kept, params.seed, p) for kept, p in zip(lists, positions, strict=True)]


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
