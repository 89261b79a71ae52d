"""A Hugging Face `tokenizers` object built from a GGUF file's tokenizer metadata (byte-level BPE only).

GGUF stores the vocabulary, the merges and each token's type; the pre-tokenizer is only *named*
(`tokenizer.ggml.pre`), so each supported name maps to the splitting rules its tokenizer.json uses. An
unknown name is refused rather than guessed: a wrong pre-tokenizer gives plausible but wrong ids.
"""

from __future__ import annotations

from pathlib import Path

from gguf import TokenType
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from elpis.text.gguf_meta import GGUFFormatError, gguf_value, open_gguf


def _pre_tokenizer(name: str) -> pre_tokenizers.PreTokenizer:
    if name == "smollm":
        # SmolLM/StarCoder: digits one by one, then the GPT-2 byte-level split.
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    if name in ("gpt2", "default"):
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    raise GGUFFormatError(f"GGUF pre-tokenizer {name!r} is not supported (supported: smollm, gpt2)")


def build_gguf_tokenizer(path: Path) -> Tokenizer:
    reader = open_gguf(path)
    kind = gguf_value(reader, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise GGUFFormatError(
            f"{path}: tokenizer model {kind!r} is not supported (only byte-level BPE 'gpt2')"
        )
    tokens: list[str] = gguf_value(reader, "tokenizer.ggml.tokens")
    types: list[int] = list(gguf_value(reader, "tokenizer.ggml.token_type"))
    merges: list[str] = gguf_value(reader, "tokenizer.ggml.merges")
    if len(types) != len(tokens):
        raise GGUFFormatError(f"{path}: {len(tokens)} tokens but {len(types)} token types")

    vocab = {token: i for i, token in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise GGUFFormatError(f"{path}: the vocabulary repeats a token")
    pairs = []
    for merge in merges:
        left, sep, right = merge.partition(" ")
        if not sep:
            raise GGUFFormatError(f"{path}: malformed merge {merge!r}")
        pairs.append((left, right))

    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=pairs, ignore_merges=False))
    tokenizer.pre_tokenizer = _pre_tokenizer(gguf_value(reader, "tokenizer.ggml.pre", "default"))
    tokenizer.decoder = decoders.ByteLevel()
    # Control tokens are special (skipped by skip_special); user-defined ones are plain added tokens.
    added = [
        AddedToken(token, special=kind == TokenType.CONTROL, normalized=False)
        for token, kind in zip(tokens, types, strict=True)
        if kind in (TokenType.CONTROL, TokenType.USER_DEFINED)
    ]
    tokenizer.add_tokens(added)
    for token in added:
        if tokenizer.token_to_id(token.content) != vocab[token.content]:
            raise GGUFFormatError(f"{path}: added token {token.content!r} changed id")
    return tokenizer


def gguf_eos_ids(path: Path) -> tuple[int, ...]:
    reader = open_gguf(path)
    eos = gguf_value(reader, "tokenizer.ggml.eos_token_id", None)
    extra = gguf_value(reader, "tokenizer.ggml.eot_token_id", None)
    return tuple(dict.fromkeys(int(i) for i in (eos, extra) if i is not None))
