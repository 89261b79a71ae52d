"""Sampling: deterministic per (seed, position), faithful to the filtered distribution, batch-independent."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch

from elpis.spec import sampling
from elpis.spec.sampling import (
    FIXED_BITS,
    SamplingParams,
    greedy_tokens,
    kept_distribution,
    position_uniform,
    sample_row,
    sample_rows,
    top_logprobs,
)
from tests.spec.sampling_rows import rows_of_every_kind


def test_position_uniform_is_a_pure_function_of_seed_and_position() -> None:
    assert position_uniform(7, 123) == position_uniform(7, 123)
    values = [position_uniform(7, p) for p in range(20000)]
    assert all(0.0 <= v < 1.0 for v in values)
    assert len(set(values)) == len(values)
    assert abs(sum(values) / len(values) - 0.5) < 0.01
    # Each tenth of [0, 1) gets its share.
    deciles = [0] * 10
    for v in values:
        deciles[int(v * 10)] += 1
    assert all(1800 < d < 2200 for d in deciles)
    assert position_uniform(8, 123) != position_uniform(7, 123)
    assert position_uniform(-1, 5) == position_uniform((1 << 64) - 1, 5)  # seeds are taken mod 2^64
    with pytest.raises(ValueError, match="position"):
        position_uniform(0, -1)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"min_p": 1.1}, "min_p"),
        ({"seed": "1"}, "seed"),
    ],
)
def test_bad_parameters_are_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_greedy_takes_the_lowest_id_among_equal_maxima() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0, 3.0], [5.0, 5.0, 5.0, 5.0], [-1.0, -2.0, -0.5, -9.0]])
    assert greedy_tokens(logits) == [1, 0, 2]
    assert sample_rows(logits, SamplingParams(), [0, 1, 2]) == [1, 0, 2]


def test_non_finite_logits_are_refused() -> None:
    bad = torch.tensor([0.0, float("nan"), 1.0])
    with pytest.raises(ValueError, match="non-finite"):
        sample_row(bad, SamplingParams(), 0)
    with pytest.raises(ValueError, match="non-finite"):
        sample_row(bad, SamplingParams(temperature=1.0), 0)
    for top_k in (1, 2):  # a top_k head read from the largest logits refuses them alike
        with pytest.raises(ValueError, match="non-finite"):
            sample_row(bad, SamplingParams(temperature=1.0, top_k=top_k), 0)
    wide = torch.randn(5000, generator=torch.Generator().manual_seed(1))
    for value in (float("nan"), float("inf")):
        row = wide.clone()
        row[4321] = value
        with pytest.raises(ValueError, match="non-finite"):
            sample_row(row, SamplingParams(temperature=0.7, top_k=20), 0)
    masked = torch.tensor([0.0, float("-inf"), 1.0])  # -inf (padding ids) is fine: zero probability
    assert sample_row(masked, SamplingParams(temperature=1.0), 0) in (0, 2)


def _frequencies(row: torch.Tensor, params: SamplingParams, draws: int) -> torch.Tensor:
    counts = torch.zeros(row.shape[0])
    for position in range(draws):
        counts[sample_row(row, params, position)] += 1
    return counts / draws


def test_samples_follow_the_tempered_distribution() -> None:
    row = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, 1.0])
    params = SamplingParams(temperature=0.7, seed=3)
    expected = torch.softmax(row.double() / 0.7, dim=0).float()
    observed = _frequencies(row, params, 6000)
    assert torch.allclose(observed, expected, atol=0.025), (observed, expected)


def _kept(row: torch.Tensor, params: SamplingParams) -> list[int]:
    ids, weights = kept_distribution(row, params)
    assert bool((weights > 0).all())
    return ids.tolist()


def test_filters_keep_exactly_the_documented_sets() -> None:
    row = torch.tensor([1.0, 3.0, 2.0, 3.0, 0.0, -2.0])
    # top_k 2 keeps the two 3.0 logits (ids 1 and 3); top_k 3 adds id 2.
    assert _kept(row, SamplingParams(temperature=1.0, top_k=2)) == [1, 3]
    assert _kept(row, SamplingParams(temperature=1.0, top_k=3)) == [1, 2, 3]
    # Ties cut at the boundary by lowest id: top_k 1 keeps id 1 only.
    assert _kept(row, SamplingParams(temperature=1.0, top_k=1)) == [1]
    probs = torch.softmax(row.double(), dim=0)
    # top_p: sorted probabilities p1 = p3 > p2 > p0 > p4 > p5; the smallest prefix reaching top_p.
    two = float(probs[1] + probs[3])
    assert _kept(row, SamplingParams(temperature=1.0, top_p=two - 1e-9)) == [1, 3]
    assert _kept(row, SamplingParams(temperature=1.0, top_p=two + 1e-9)) == [1, 2, 3]
    # min_p relative to the best token: exp(2-3) = 0.37 passes 0.3, exp(1-3) = 0.135 does not.
    assert _kept(row, SamplingParams(temperature=1.0, min_p=0.3)) == [1, 2, 3]


@pytest.mark.parametrize("top_k", [0, 4])
def test_a_top_p_prefix_that_reaches_its_share_exactly_stops_there(top_k: int) -> None:
    """Four equal maxima weigh 2^44 each in fixed point: top_p 0.5 of their 2^46 is reached exactly by two of
    them (lowest ids first), and a top_p one ulp above 0.5 needs a third. Both the head (top_k) and the
    whole-vocabulary path compare an integer total with top_p of the mass exactly."""
    row = torch.tensor([0.0, 5.0, -1.0, 5.0, 5.0, 5.0, 2.0])
    half = SamplingParams(temperature=1.0, top_k=top_k, top_p=0.5)
    above = SamplingParams(temperature=1.0, top_k=top_k, top_p=math.nextafter(0.5, 1.0))
    if top_k:
        assert _kept(row, half) == [1, 3]
        assert _kept(row, above) == [1, 3, 4]
    else:  # the rest of the row weighs in too: e^-3 + e^-5 + e^-6 of a maximum's weight
        assert _kept(row, SamplingParams(temperature=1.0, top_p=0.5)) == [1, 3, 4]


@pytest.mark.parametrize("seed", range(6))
def test_partial_sorting_keeps_what_a_full_stable_sort_keeps(seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    # Coarse logits: many exact ties; a flat row's top_p prefix runs deep into the ranking.
    row = torch.randint(-40, 40, (20000,), generator=generator).float() / (4.0 if seed % 2 else 40.0)
    for top_k, top_p in ((0, 0.9), (30, 1.0), (500, 0.7), (0, 0.3), (7, 0.5)):
        params = SamplingParams(temperature=1.0, top_k=top_k, top_p=top_p)
        probs = torch.exp(row.double() - row.max().double())
        order = torch.sort(probs, descending=True, stable=True).indices
        limit = top_k or len(row)
        head = order[:limit]
        # the documented sums: weights in fixed point, compared with top_p of their total exactly
        fixed = [math.floor(float(probs[i]) * 2**FIXED_BITS) for i in head.tolist()]
        reach = Fraction(top_p) * sum(fixed)
        keep = next(n for n in range(1, limit + 1) if sum(fixed[:n]) >= reach) if top_p < 1 else limit
        expected = sorted(head[:keep].tolist())
        assert _kept(row, params) == expected, (top_k, top_p)


def test_filtered_samples_stay_in_the_kept_set_with_renormalised_frequencies() -> None:
    row = torch.tensor([1.0, 3.0, 2.0, 3.0, 0.0, -2.0])
    params = SamplingParams(temperature=1.3, top_k=3, seed=11)
    observed = _frequencies(row, params, 4000)
    assert observed[[0, 4, 5]].sum() == 0
    kept = torch.softmax(row[[1, 2, 3]].double() / 1.3, dim=0).float()
    assert torch.allclose(observed[[1, 2, 3]], kept, atol=0.03)


@pytest.mark.parametrize("filters", [
    {"top_p": 0.95, "top_k": 50, "min_p": 0.01}, {"top_k": 20}, {"top_p": 0.9}, {"min_p": 0.05}, {},
])
def test_rows_draw_the_same_tokens_alone_or_among_other_rows(filters: dict) -> None:
    """Each path of the draw (a top_k head, top_p over the ranked vocabulary, the whole vocabulary) on rows of
    several kinds, ties and -inf included: 16 rows together draw what each draws alone, at 40 positions."""
    generator = torch.Generator().manual_seed(5)
    logits = torch.randn(16, 30011, generator=generator) * 3  # an odd width: no row starts on a vector edge
    logits[3] = torch.randint(-3, 3, (30011,), generator=generator).float()  # coarse: many ties
    logits[5, ::7] = float("-inf")
    logits[9] *= 0.01  # nearly flat: a deep top_p prefix
    params = SamplingParams(temperature=0.9, seed=42, **filters)
    for start in range(0, 40, 8):
        positions = list(range(start, start + 16))
        together = sample_rows(logits, params, positions)
        alone = [sample_rows(logits[r : r + 1].clone(), params, [positions[r]])[0] for r in range(16)]
        assert together == alone, filters


def test_a_row_draws_the_same_token_alone_or_among_other_rows() -> None:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(16, 5000, generator=generator) * 3
    params = SamplingParams(temperature=0.9, top_p=0.95, top_k=50, min_p=0.01, seed=42)
    positions = list(range(100, 116))
    together = sample_rows(logits, params, positions)
    alone = [sample_rows(logits[r : r + 1].clone(), params, [positions[r]])[0] for r in range(16)]
    assert together == alone
    # The same row drawn for another position or seed generally gives other tokens.
    shifted = sample_rows(logits, params, [p + 1 for p in positions])
    reseeded = sample_rows(logits, SamplingParams(temperature=0.9, top_p=0.95, top_k=50, min_p=0.01, seed=43),
                           positions)
    assert shifted != together and reseeded != together


def test_top_logprobs_are_the_raw_log_softmax() -> None:
    row = torch.tensor([0.5, 2.0, 2.0, -1.0, 1.0])
    token, logprob, alternatives = top_logprobs(row, 4, 3)
    expected = torch.log_softmax(row.double(), dim=0)
    assert token == 4 and math.isclose(logprob, float(expected[4]))
    assert [i for i, _ in alternatives] == [1, 2, 4]
    assert all(math.isclose(v, float(expected[i])) for i, v in alternatives)
    assert top_logprobs(row, 0, 0)[2] == []
    with pytest.raises(ValueError, match="top_logprobs"):
        top_logprobs(row, 0, 21)


def test_a_masked_row_keeps_only_the_tokens_it_allows() -> None:
    """A grammar's mask leaves three tokens of a 248,320-row vocabulary: top_k 20 keeps those three (the -inf
    rows weigh 0 and are never drawn), and every draw is one of them."""
    row = torch.full((248_320,), float("-inf"))
    row[[3, 17, 200_000]] = torch.tensor([1.0, 2.0, 0.5])
    params = SamplingParams(temperature=0.8, top_k=20, top_p=0.95, seed=4)
    assert _kept(row, params) == [3, 17, 200_000]
    draws = sample_rows(row.repeat(32, 1), params, list(range(32)))
    assert set(draws) <= {3, 17, 200_000} and len(set(draws)) > 1


def _whole_vocabulary_heads(logits: torch.Tensor, params: SamplingParams) -> list[list[tuple[float, int]]]:
    w, _ = sampling._weights(logits, params)
    return sampling._candidates(w, min(params.top_k, logits.shape[1]))


@pytest.mark.parametrize("seed", range(4))
def test_a_top_k_head_from_the_largest_logits_is_the_whole_vocabularys(seed: int, monkeypatch) -> None:
    """The head read from a row's top_k + TOP_PAD largest logits is exactly the one the whole vocabulary's
    weights give, on rows where its edge clears them or where all the row's weight is read (a grammar's
    mask); where it does not (ties across the edge), the whole vocabulary decides, and every draw is the same
    either way."""
    logits = rows_of_every_kind(9001, seed)
    fast_rows = 0
    for top_k in (1, 5, 20, 50):
        params = SamplingParams(temperature=0.7, top_k=top_k, top_p=0.8, seed=seed)
        whole = _whole_vocabulary_heads(logits, params)
        for r in range(logits.shape[0]):
            heads = sampling._top_candidates(logits[r : r + 1], params, top_k)
            if heads is not None:
                fast_rows += 1
                assert heads == [whole[r]], (top_k, r)
        # ties across the edge are not read from the top; a row masked below top_k is, its zeros left out
        assert sampling._top_candidates(logits[1:2], params, top_k) is None
        assert sampling._top_candidates(logits[4:5], params, top_k) == [whole[4]]
        if top_k >= 5:  # the five tokens the mask allows, no zero-weight ties
            assert sorted(token for _, token in whole[4]) == [0, 1, 2, 3, 4]
        if top_k + sampling.TOP_PAD < 40:
            assert sampling._top_candidates(logits[6:7], params, top_k) is None
    assert fast_rows >= 4 * 6  # the random rows at least
    params = SamplingParams(temperature=0.7, top_k=20, top_p=0.8, min_p=0.01, seed=seed)
    positions = list(range(64))
    rows = logits.repeat(6, 1)[:64]
    fast = sample_rows(rows, params, positions)
    monkeypatch.setattr(sampling, "_top_candidates", lambda *args: None)
    assert sample_rows(rows, params, positions) == fast


def test_the_edge_rule_refuses_a_head_the_largest_logits_do_not_hold() -> None:
    """Teeth: with the rule off, a head whose tied edge runs past the largest logits read would lose the
    lowest ids among the ties (topk's pick among equals is not by id)."""
    row = torch.zeros(1, 200)
    row[0, 150:] = 1.0  # fifty equal maxima, ids 150..199
    params = SamplingParams(temperature=1.0, top_k=5)
    assert sampling._top_candidates(row, params, 5) is None
    assert [token for _, token in _whole_vocabulary_heads(row, params)[0][:5]] == [150, 151, 152, 153, 154]
    assert _kept(row[0], params) == [150, 151, 152, 153, 154]


@pytest.mark.gpu
def test_sampling_on_cuda_is_batch_independent_and_filters_alike(monkeypatch) -> None:
    generator = torch.Generator().manual_seed(1)
    logits = (torch.randn(16, 50000, generator=generator) * 3).cuda()
    logits[3] = torch.randint(-3, 3, (50000,), generator=generator).float().cuda()  # coarse: many ties
    positions = list(range(40, 56))
    for params in (SamplingParams(temperature=0.8, top_p=0.9, top_k=100, min_p=0.02, seed=9),
                   SamplingParams(temperature=0.8, top_p=0.9, seed=9)):  # a top_k head; the ranked vocabulary
        together = sample_rows(logits, params, positions)
        alone = [sample_rows(logits[r : r + 1].clone(), params, [positions[r]])[0] for r in range(16)]
        assert together == alone, params
    # a top_k head read from the largest logits on the GPU: the whole vocabulary's, as on the CPU
    rows = rows_of_every_kind(50000, 2).cuda()
    params = SamplingParams(temperature=0.7, top_k=20, top_p=0.8, seed=2)
    assert sampling._top_candidates(rows[:1], params, 20) is not None
    fast = sample_rows(rows, params, list(range(12)))
    bad = rows[:2].clone()
    bad[1, 777] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        sample_rows(bad, params, [0, 1])
    with monkeypatch.context() as whole:
        whole.setattr(sampling, "_top_candidates", lambda *args: None)
        assert sample_rows(rows, params, list(range(12))) == fast
    assert greedy_tokens(logits) == greedy_tokens(logits.cpu())
    row = torch.tensor([1.0, 3.0, 2.0, 3.0, 0.0, -2.0])
    for kwargs in ({"top_k": 2}, {"top_p": 0.8}, {"min_p": 0.3}):
        cpu = _kept(row, SamplingParams(temperature=1.0, **kwargs))
        assert _kept(row.cuda(), SamplingParams(temperature=1.0, **kwargs)) == cpu


def test_a_verifys_rows_are_read_back_together(monkeypatch) -> None:
    """The rows' samplers run in lockstep: the host transfers of a call do not grow with its rows."""
    reads = {"n": 0}

    def counted(name: str):
        original = getattr(torch.Tensor, name)

        def read(self, *args):
            reads["n"] += 1
            return original(self, *args)

        return read

    for name in ("tolist", "item", "__float__", "__int__", "__index__", "__bool__"):  # every way to the host
        monkeypatch.setattr(torch.Tensor, name, counted(name))
    logits = torch.randn(16, 3000, generator=torch.Generator().manual_seed(4)) * 3
    for params in (SamplingParams(temperature=0.6, top_p=0.95, top_k=20), SamplingParams(temperature=1.0),
                   SamplingParams(temperature=0.8, top_p=0.9, min_p=0.02)):  # fmt: skip
        alone = []
        for r in range(16):
            reads["n"] = 0
            sample_rows(logits[r : r + 1], params, [r])
            alone.append(reads["n"])
        reads["n"] = 0
        sample_rows(logits, params, list(range(16)))
        # as many as one row needs, not their sum
        assert reads["n"] == max(alone) <= 12, (params, alone, reads["n"])


def test_a_declined_device_draws_weights_serve_the_host_path() -> None:
    """`sample_rows` hands the top weights it computed for a device draw that declined to the host's path: the
    host's heads from them are the ones it computes itself, declined rows (ties past the edge) included."""
    logits = rows_of_every_kind(9001, 4)
    for params in (SamplingParams(temperature=0.7, top_k=20, top_p=0.8, seed=1),
                   SamplingParams(temperature=1.3, top_k=5, min_p=0.05, seed=2)):  # fmt: skip
        for r in range(logits.shape[0]):
            rows = logits[r : r + 1]
            top = sampling.top_weights(rows, params, min(params.top_k, rows.shape[1]))
            assert sampling._kept_lists(rows, params, top) == sampling._kept_lists(rows, params), (params, r)
