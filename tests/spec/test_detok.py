"""Incremental detokenisation with the real Qwen vocabulary: whole characters only, same text as a full
decode."""

from __future__ import annotations

import random

import pytest

from elpis.spec.detok import IncrementalDetokenizer

TEXTS = (
    "Plain ASCII, with spaces.",
    "Héllo wörld: 世界 and emoji 🎉🧪 mixed in",
    "Special <|im_end|> inside, then more",
)


@pytest.fixture(scope="module")
def tokenizer(tiny_models):
    return tiny_models[0].tokenizer


@pytest.mark.parametrize("text", TEXTS)
def test_deltas_are_whole_characters_and_add_up(tokenizer, text: str) -> None:
    prompt = tokenizer.encode("Answer:")
    ids = tokenizer.encode(text)
    detokenizer = IncrementalDetokenizer(tokenizer, prompt)
    deltas = [detokenizer.push(t) for t in ids]
    deltas.append(detokenizer.flush())
    assert "".join(deltas) == tokenizer.decode(ids, skip_special=True)
    assert not any("\ufffd" in d for d in deltas)


def test_multibyte_characters_split_over_tokens_are_held_until_complete(tokenizer) -> None:
    ids = tokenizer.encode(" 🎉")
    assert len(ids) > 1  # the byte-level vocabulary splits this emoji
    detokenizer = IncrementalDetokenizer(tokenizer)
    assert [detokenizer.push(t) for t in ids[:-1]] == [""] * (len(ids) - 1)
    assert detokenizer.push(ids[-1]) == tokenizer.decode(ids)


@pytest.mark.parametrize("seed", range(3))
def test_random_ids_decode_like_a_full_decode(tokenizer, seed: int) -> None:
    rng = random.Random(seed)
    ids = [rng.randrange(tokenizer.vocab_size) for _ in range(60)]
    detokenizer = IncrementalDetokenizer(tokenizer, [rng.randrange(tokenizer.vocab_size) for _ in range(5)])
    text = "".join(detokenizer.push(t) for t in ids) + detokenizer.flush()
    assert text == tokenizer.decode(ids, skip_special=True)
