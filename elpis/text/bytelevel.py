"""The byte-level BPE alphabet: every byte is shown as one printable character.

Hugging Face `tokenizers` (and GPT-2 style vocabularies, GGUF included) store byte-level tokens as strings in
this alphabet: printable Latin-1 bytes stand for themselves, the other 68 bytes are shifted to 256 + n.
"""

from __future__ import annotations

from functools import cache


@cache
def byte_to_char() -> dict[int, str]:
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table: dict[int, str] = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shifted)
            shifted += 1
    return table


def bytes_to_token(data: bytes) -> str:
    table = byte_to_char()
    return "".join(table[b] for b in data)
