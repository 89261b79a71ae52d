"""Tree verify: each row equals plain decoding of its path; commit leaves the sequential state."""

from __future__ import annotations

import random

import pytest
import torch

from elpis.reference.backend import ReferenceBackend
from elpis.reference.model import ReferenceModel, ancestor_mask, tree_depths
from elpis.reference.state import KVCache, SequenceState

PROMPT = [248045, 846, 198, 9419, 11, 1204, 513, 488, 30, 248046, 198, 248045, 74455, 198, 248068]


def random_tree(rng: random.Random, rows: int, vocab: int) -> tuple[list[int], list[int]]:
    parents = [-1] + [rng.randrange(r) for r in range(1, rows)]
    tokens = [rng.randrange(vocab) for _ in range(rows)]
    return tokens, parents


def path_of(parents: list[int], row: int) -> list[int]:
    path = []
    while row >= 0:
        path.append(row)
        row = parents[row]
    return path[::-1]


def decode_path(backend: ReferenceBackend, prompt: list[int], path_tokens: list[int]) -> torch.Tensor:
    """Plain decoding: one verify/commit per token; returns the logits after the last token."""
    backend.begin(prompt + path_tokens[:1])
    for i, token in enumerate(path_tokens):
        logits = backend.verify([token], [-1])
        if i + 1 < len(path_tokens):
            backend.commit([0])
    return logits[0]


def assert_states_equal(a: SequenceState, b: SequenceState, exact: bool, tolerance: float = 1e-5) -> None:
    assert a.tokens == b.tokens
    for x, y in zip(a.layers, b.layers, strict=True):
        pairs = (
            [(x.keys[: x.length], y.keys[: y.length]), (x.values[: x.length], y.values[: y.length])]
            if isinstance(x, KVCache)
            else [(x.window, y.window), (x.recurrent, y.recurrent)]
        )
        for p, q in pairs:
            if exact:
                assert torch.equal(p, q)
            else:
                assert ((p - q).abs().max() / q.abs().max().clamp_min(1e-30)).item() < tolerance


def sequential_state(model: ReferenceModel, prompt: list[int], tokens: list[int]) -> SequenceState:
    backend = ReferenceBackend(model, model_id="seq", max_context=4096, stop_token_ids=(0,))
    backend.begin(prompt + tokens[:1])
    for i, token in enumerate(tokens):
        backend.verify([token], [-1])
        backend.commit([0])
        assert backend.position() == len(prompt) + i + 1
    return backend.committed_state()


def test_depths_and_masks() -> None:
    parents = [-1, 0, 0, 1, 3, 2]
    assert tree_depths(parents) == [0, 1, 1, 2, 3, 2]
    mask = ancestor_mask(parents, "cpu")
    assert mask[4].tolist() == [True, True, False, True, True, False]
    assert mask[5].tolist() == [True, False, True, False, False, True]


@pytest.mark.parametrize("seed", range(4))
def test_rows_equal_plain_decoding_bit_for_bit(tiny_model: ReferenceModel, seed: int) -> None:
    rng = random.Random(seed)
    rows = rng.choice([2, 5, 9, 16])
    tokens, parents = random_tree(rng, rows, 248077)
    tree_backend = ReferenceBackend(tiny_model, model_id="tree", max_context=4096, stop_token_ids=(0,))
    tree_backend.begin(PROMPT + tokens[:1])
    logits = tree_backend.verify(tokens, parents)
    assert logits.shape == (rows, 248320) and logits.dtype == torch.float32
    plain = ReferenceBackend(tiny_model, model_id="plain", max_context=4096, stop_token_ids=(0,))
    for row in range(rows):
        expected = decode_path(plain, PROMPT, [tokens[r] for r in path_of(parents, row)])
        assert torch.equal(logits[row], expected), f"row {row}"

    # commit the path to the deepest row: the state equals decoding those tokens one by one
    deepest = max(range(rows), key=lambda r: (tree_depths(parents)[r], r))
    accepted = path_of(parents, deepest)
    tree_backend.commit(accepted)
    assert tree_backend.position() == len(PROMPT) + len(accepted)
    expected_state = sequential_state(tiny_model, PROMPT, [tokens[r] for r in accepted])
    assert_states_equal(tree_backend.committed_state(), expected_state, exact=True)


def test_row_does_not_depend_on_other_rows(tiny_model: ReferenceModel) -> None:
    backend = ReferenceBackend(tiny_model, model_id="t", max_context=4096, stop_token_ids=(0,))
    backend.begin([*PROMPT, 5])
    small = backend.verify([5, 77, 99], [-1, 0, 1])
    big = backend.verify([5, 1234, 77, 4, 99, 8], [-1, 0, 0, 1, 2, 4])
    assert torch.equal(small[0], big[0]) and torch.equal(small[1], big[2]) and torch.equal(small[2], big[4])


def test_commit_after_tree_then_continue(tiny_model: ReferenceModel) -> None:
    """Several rounds of verify + partial commit give the same tokens' logits as plain decoding."""
    rng = random.Random(42)
    backend = ReferenceBackend(tiny_model, model_id="t", max_context=4096, stop_token_ids=(0,))
    backend.begin([*PROMPT, 300])
    committed: list[int] = []
    anchor = 300
    for _ in range(4):
        tokens, parents = random_tree(rng, 6, 248077)
        tokens[0] = anchor
        logits = backend.verify(tokens, parents)
        accepted = path_of(parents, rng.randrange(6))
        backend.commit(accepted)
        committed += [tokens[r] for r in accepted]
        anchor = int(logits[accepted[-1]].argmax())
    assert_states_equal(
        backend.committed_state(), sequential_state(tiny_model, PROMPT, committed), exact=True
    )


@pytest.mark.parametrize("seed", range(2))
def test_batched_mode_agrees_to_rounding(tiny_model: ReferenceModel, seed: int) -> None:
    rng = random.Random(100 + seed)
    tokens, parents = random_tree(rng, 12, 248077)
    exact = ReferenceBackend(tiny_model, model_id="e", max_context=4096, stop_token_ids=(0,))
    batched = ReferenceBackend(
        tiny_model, model_id="b", max_context=4096, stop_token_ids=(0,), exact_rows=False
    )
    for backend in (exact, batched):
        backend.begin(PROMPT + tokens[:1])
    reference, ours = exact.verify(tokens, parents), batched.verify(tokens, parents)
    assert ((ours - reference).abs().max() / reference.abs().max()).item() < 1e-5
    accepted = path_of(parents, 11)
    exact.commit(accepted)
    batched.commit(accepted)
    assert_states_equal(batched.committed_state(), exact.committed_state(), exact=False)


def test_prefill_agrees_with_decoding_to_rounding(tiny_model: ReferenceModel) -> None:
    # The random 8-layer tiny model amplifies float32 rounding: against float64 its prefill logits are off
    # by about 5e-5 relative and its decode logits by about 2e-5 after 100 tokens, hence 1e-4 here.
    tokens = list(range(5000, 5100))
    backend = ReferenceBackend(tiny_model, model_id="t", max_context=4096, stop_token_ids=(0,))
    prefill = backend.prompt_logits(tokens)
    backend.begin(tokens[:1])
    steps = []
    for token in tokens:
        steps.append(backend.verify([token], [-1])[0])
        backend.commit([0])
    steps = torch.stack(steps)
    assert ((prefill - steps).abs().max() / steps.abs().max()).item() < 1e-4
    assert torch.equal(prefill.argmax(-1), steps.argmax(-1))
    prefilled = ReferenceBackend(tiny_model, model_id="p", max_context=4096, stop_token_ids=(0,))
    prefilled.begin([*tokens, 1])
    assert_states_equal(prefilled.committed_state(), backend.committed_state(), exact=False, tolerance=1e-4)
