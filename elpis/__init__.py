"""elpis: fast, lossless speculative decoding and prefill for 4-bit Qwen3.8-27B on one 24 GiB GPU."""

__version__ = "0.1.0"
