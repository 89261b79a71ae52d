"""`elpis quantize` / `elpis dequantize` refuse bad input with a message before touching a GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from elpis.cli import main
from elpis.exl3 import dequant, quantize


def _hf_dir(path: Path, **extra) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], **extra}))
    return path


def test_quantize_refusals(tmp_path, capsys):
    assert main(["quantize", "--model", str(tmp_path / "none"), "--out", str(tmp_path / "o")]) == 2
    assert "no config.json" in capsys.readouterr().err
    done = _hf_dir(tmp_path / "q", quantization_config={"quant_method": "exl3"})
    with pytest.raises(ValueError, match="already quantized"):
        quantize.convert(done, tmp_path / "o")
    hf = _hf_dir(tmp_path / "hf")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x").write_text("x")
    with pytest.raises(ValueError, match="not empty"):
        quantize.convert(hf, busy)
    with pytest.raises(ValueError, match="out of range"):
        quantize.convert(hf, tmp_path / "o", bits=9)


def test_dequantize_refusals(tmp_path, capsys):
    hf = _hf_dir(tmp_path / "hf")
    assert main(["dequantize", "--model", str(hf), "--out", str(tmp_path / "o")]) == 2
    assert "no quantization_config" in capsys.readouterr().err
    with pytest.raises(ValueError, match="exists"):
        dequant.dequantise(hf, hf)
    with pytest.raises(ValueError, match=r"no config\.json"):
        dequant.dequantise(tmp_path / "missing", tmp_path / "o2")
