"""ReferenceBackend: the Backend protocol, its errors, and the prefix cache."""

from __future__ import annotations

import pytest
import torch

from elpis.backend import Backend, BackendInfo
from elpis.reference.backend import ReferenceBackend
from elpis.reference.model import ReferenceModel
from elpis.reference.prefix_cache import PrefixCache

PROMPT = list(range(1000, 1030))


def greedy(backend: ReferenceBackend, prompt: list[int], steps: int) -> tuple[list[int], int]:
    cached = backend.begin(prompt)
    anchor, out = prompt[-1], []
    for _ in range(steps):
        logits = backend.verify([anchor], [-1])
        backend.commit([0])
        anchor = int(logits[0].argmax())
        out.append(anchor)
    return out, cached


def test_protocol_and_info(tiny_backend: ReferenceBackend) -> None:
    assert isinstance(tiny_backend, Backend)
    assert tiny_backend.info == BackendInfo("reference", "tiny", 248320, 4096, (248046, 248044), "cpu")


def test_position_counts_committed_tokens(tiny_backend: ReferenceBackend) -> None:
    assert tiny_backend.begin(PROMPT) == 0
    assert tiny_backend.position() == len(PROMPT) - 1  # the anchor has not run yet
    logits = tiny_backend.verify([PROMPT[-1], 5, 6], [-1, 0, 1])
    assert tiny_backend.position() == len(PROMPT) - 1
    tiny_backend.commit([0, 1])
    assert tiny_backend.position() == len(PROMPT) + 1
    assert logits.shape == (3, 248320)


def test_prefix_cache_reuse_is_exact(tiny_model: ReferenceModel) -> None:
    backend = ReferenceBackend(tiny_model, model_id="t", max_context=4096, stop_token_ids=(0,))
    first, cached = greedy(backend, PROMPT, 6)
    assert cached == 0
    again, cached = greedy(backend, PROMPT, 6)
    assert cached == len(PROMPT) - 1 and again == first
    # The finished sequence (prompt + 6 generated) serves a longer follow-up prompt...
    follow_up = PROMPT + first + [7, 8]
    backend.begin(follow_up)
    assert backend.position() == len(follow_up) - 1
    logits = backend.verify([8], [-1])
    backend.finish()
    assert backend.begin(follow_up) == len(follow_up) - 1  # ... and then the snapshot of its own prompt
    assert torch.equal(backend.verify([8], [-1]), logits)
    # A prompt that shares only part of a snapshot cannot use it (DeltaNet state cannot be rewound).
    assert backend.begin([*PROMPT[:10], 1, 2, 3]) == 0


def test_prefix_cache_is_bounded_lru(tiny_model: ReferenceModel) -> None:
    state = tiny_model.new_state()
    tiny_model.prefill(state, [1, 2, 3])
    size = state.snapshot().nbytes()
    cache = PrefixCache(max_bytes=2 * size + 10)
    for first in (1, 4, 7):
        s = tiny_model.new_state()
        tiny_model.prefill(s, [first, first + 1, first + 2])
        cache.store(s.snapshot())
        if first == 4:
            assert cache.longest_prefix([1, 2, 3, 9], 4) is not None  # touch [1, 2, 3]
    assert len(cache) == 2 and cache.nbytes <= cache.max_bytes
    assert cache.longest_prefix([4, 5, 6, 0], 4) is None  # least recently used, evicted
    assert cache.longest_prefix([1, 2, 3, 0], 4).tokens == [1, 2, 3]
    assert cache.longest_prefix([1, 2, 3, 0], 2) is None  # limit respected
    tiny = PrefixCache(max_bytes=10)
    tiny.store(state.snapshot())
    assert len(tiny) == 0


def test_tree_with_prefix_cache_state_is_exact(tiny_model: ReferenceModel) -> None:
    """A restored snapshot behaves exactly like the state it was taken from."""
    a = ReferenceBackend(tiny_model, model_id="a", max_context=4096, stop_token_ids=(0,))
    b = ReferenceBackend(tiny_model, model_id="b", max_context=4096, stop_token_ids=(0,))
    a.begin(PROMPT)
    b.begin(PROMPT)
    b.finish()
    assert b.begin(PROMPT) == len(PROMPT) - 1
    tokens, parents = [PROMPT[-1], 11, 12, 13], [-1, 0, 0, 2]
    assert torch.equal(a.verify(tokens, parents), b.verify(tokens, parents))


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda b: b.verify([1], [-1]), RuntimeError, "begin"),
        (lambda b: b.position(), RuntimeError, "begin"),
        (lambda b: b.begin([]), ValueError, "at least one token"),
        (lambda b: b.begin([248320]), ValueError, "outside"),
        (lambda b: b.begin([-1]), ValueError, "outside"),
        (lambda b: b.begin(list(range(5000))), ValueError, "max_context"),
    ],
)
def test_errors_before_begin(tiny_backend: ReferenceBackend, call, error, message) -> None:
    with pytest.raises(error, match=message):
        call(tiny_backend)


def test_errors_during_a_sequence(tiny_backend: ReferenceBackend) -> None:
    tiny_backend.begin([5, 6, 7])
    with pytest.raises(RuntimeError, match="verify"):
        tiny_backend.commit([0])
    with pytest.raises(ValueError, match="anchor"):
        tiny_backend.verify([8], [-1])
    with pytest.raises(ValueError, match=r"parents\[0\]"):
        tiny_backend.verify([7, 1], [0, 0])
    with pytest.raises(ValueError, match=r"parents\[2\]"):
        tiny_backend.verify([7, 1, 2], [-1, 0, 2])
    with pytest.raises(ValueError, match="one parent per row"):
        tiny_backend.verify([7, 1], [-1])
    tiny_backend.verify([7, 1, 2, 3], [-1, 0, 0, 1])
    for rows in ([1], [], [0, 2, 3], [0, 4], [0, 1, 2]):
        with pytest.raises(ValueError, match="path"):
            tiny_backend.commit(rows)
    tiny_backend.commit([0, 1, 3])
    with pytest.raises(RuntimeError, match="verify"):
        tiny_backend.commit([0])
    assert tiny_backend.position() == 5
    # after a commit the next anchor comes from the caller, whatever it is
    tiny_backend.verify([123], [-1])


def test_max_context_counts_rows(tiny_model: ReferenceModel) -> None:
    backend = ReferenceBackend(tiny_model, model_id="t", max_context=8, stop_token_ids=(0,))
    backend.begin([1, 2, 3, 4, 5])
    with pytest.raises(ValueError, match="max_context"):
        backend.verify([5, 1, 2, 3, 4], [-1, 0, 1, 2, 3])
    backend.verify([5, 1, 2, 3], [-1, 0, 1, 2])
    backend.commit([0, 1, 2, 3])
    assert backend.position() == 8
    with pytest.raises(ValueError, match="max_context"):
        backend.verify([1], [-1])


def test_nan_logits_make_a_backend_error(tiny_dir) -> None:
    from elpis.backend import BackendError
    from elpis.reference.loader import load_model

    model = load_model(tiny_dir)
    model.weights.final_norm[0] = float("nan")
    backend = ReferenceBackend(model, model_id="t", max_context=64, stop_token_ids=(0,))
    backend.begin([1, 2])
    with pytest.raises(BackendError, match="non-finite"):
        backend.verify([2], [-1])
