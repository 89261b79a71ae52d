"""Exact-numerics reference backend in PyTorch: Qwen3.5/3.8 hybrid (Gated DeltaNet + gated attention), Llama.

Public entry points: `load_backend(model_path, ...)` (a Hugging Face directory or a GGUF file) returning a
`ReferenceBackend` (the `elpis.backend.Backend` protocol); `synth.write_tiny` for the tiny test checkpoint;
`assets.ensure_smollm2()` for the embedded default model; `export.export_hf(gguf, out_dir)` (CLI `elpis
export-hf`) writes a Llama GGUF as a standard Hugging Face Llama directory with the exact weights.
"""

from elpis.reference.backend import ReferenceBackend
from elpis.reference.loader import load_backend, load_model

__all__ = ["ReferenceBackend", "load_backend", "load_model"]
