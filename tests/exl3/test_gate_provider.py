"""The ExLlamaV3 gate provider (`elpis.exl3.gate`).

CPU: the provider is found through `elpis.gate.providers` without a GPU; options are parsed and refused with
clear messages; spec strings list every option; GPU-only entry points refuse cleanly without CUDA; the fp64
evaluations (EXL3 weight, attention, RMSNorm, delta rule) equal independent formulations.

GPU (`-m gpu`, small synthetic checkpoint; ELPIS_SMALL_DIR may name an `elpis synth --small` output):
`elpis gate op --backend exl3` writes a measurement with every op's fp64 error and the candidates' bar.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
from pathlib import Path

import pytest
import torch

from elpis.exl3 import gate
from elpis.gate import cli as gate_cli
from elpis.gate.configs import Spec, make_configuration
from elpis.gate.providers import load_provider

# --- provider and options -------------------------------------------------------------------------------


def test_provider_found_without_gpu():
    provider = load_provider("exl3")
    assert provider is gate
    assert callable(provider.gate_ops) and callable(provider.configuration)


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("none", ()),
        ("elpis", ("fixed-rows-8", "gdn-state-fp32")),
        (
            "all",
            (
                "exl3-attn-hadamard-fold",
                "exl3-int8-gemv-off",
                "fixed-rows-8",
                "gdn-ba",
                "gdn-state-fp32",
                "prefill-chunk-8192",
                "rows-gemm",
                "tree-verify",
            ),
        ),
        ("gdn-state-fp32+prefill-chunk-8192", ("gdn-state-fp32", "prefill-chunk-8192")),
        ("gdn-state-fp32", ("gdn-state-fp32",)),
        ("gdn-state-fp32+exl3-int8-gemv-off", ("exl3-int8-gemv-off", "gdn-state-fp32")),
    ],
)
def test_parse_patches(text, names):
    assert gate.parse_patches(text) == names


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("bogus", "unknown patch"),
        ("fixed-rows-8+", "unknown patch"),
        ("", "unknown patch"),
        ("fixed-rows-8+fixed-rows-8", "names a patch twice"),
    ],
)
def test_parse_patches_refuses(text, message):
    with pytest.raises(ValueError, match=message):
        gate.parse_patches(text)


def test_every_numerics_patch_of_the_registry_is_known():
    from elpis.exl3.patches import load_registry

    assert {p.id for p in load_registry()} <= set(gate.PATCHES) | set(gate.NEUTRAL_PATCHES)
    assert not set(gate.PATCHES) & set(gate.NEUTRAL_PATCHES)
    assert set(gate.ELPIS_DEFAULTS) <= set(gate.PATCHES)


def test_configuration_options_and_spec():
    full = gate.configuration_options({})
    assert full == {"patches": "none", "rows": "8"}
    assert Spec("exl3", full).text == "exl3:patches=none,rows=8"
    full = gate.configuration_options({"patches": "fixed-rows-8+gdn-state-fp32", "rows": "16"})
    assert Spec("exl3", full).text == "exl3:patches=fixed-rows-8+gdn-state-fp32,rows=16"
    assert (
        Spec("exl3", gate.configuration_options({"path": "forward"})).text == "exl3:patches=none,path=forward"
    )


def test_a_kernel_patch_names_its_code(tmp_path, monkeypatch):
    import shutil

    import elpis.paths

    full = gate.configuration_options({"patches": "gdn-state-fp32+rows-gemm+tree-verify"})
    code = full["code"]
    assert len(code) == gate.CODE_DIGEST_HEX and int(code, 16) >= 0
    assert Spec("exl3", full).text == f"exl3:code={code},patches=gdn-state-fp32+rows-gemm+tree-verify,rows=8"
    # naming the checkout's code is the same configuration; naming other code is refused
    rows_code = gate.code_digest(["rows-gemm"])
    assert rows_code not in (None, code)
    assert gate.configuration_options({"patches": "rows-gemm", "code": rows_code}) == {
        "code": rows_code, "patches": "rows-gemm", "rows": "8",
    }  # fmt: skip
    with pytest.raises(ValueError, match=f"kernel sources of patches=rows-gemm are code={rows_code}"):
        gate.configuration_options({"patches": "rows-gemm", "code": code})
    # the gate-projection kernel carries its code too; naming both kernels digests both's sources
    ba = gate.configuration_options({"patches": "gdn-ba+gdn-state-fp32+tree-verify"})["code"]
    both = gate.configuration_options({"patches": "gdn-ba+gdn-state-fp32+rows-gemm+tree-verify"})["code"]
    assert len({code, ba, both}) == 3
    tree = gate.configuration_options({"patches": "gdn-state-fp32+tree-verify"})["code"]
    assert len({code, ba, both, tree}) == 4
    with pytest.raises(ValueError, match="leave code out"):
        gate.configuration_options({"patches": "fixed-rows-8+gdn-state-fp32", "code": code})
    # a changed kernel source is another configuration; a missing one has no identity
    for rel in gate.KERNEL_SOURCES["rows-gemm"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(elpis.paths.REPO_ROOT / rel, tmp_path / rel)
    monkeypatch.setattr(elpis.paths, "REPO_ROOT", tmp_path)
    assert gate.code_digest(["rows-gemm"]) == rows_code
    kernel = tmp_path / gate.KERNEL_SOURCES["rows-gemm"][0]
    kernel.write_bytes(kernel.read_bytes() + b"\n")
    assert gate.code_digest(["rows-gemm"]) != rows_code
    kernel.unlink()
    with pytest.raises(ValueError, match="is missing"):
        gate.code_digest(["rows-gemm", "tree-verify"])


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"patches": "gdn-state-fp32+fixed-rows-8"}, "write patches=fixed-rows-8\\+gdn-state-fp32"),
        ({"patches": "elpis"}, "write patches=fixed-rows-8\\+gdn-state-fp32"),
        ({"patches": "nope"}, "unknown patch"),
        ({"rows": "0"}, "rows must be an integer 1..16"),
        ({"rows": "17"}, "rows must be an integer 1..16"),
        ({"rows": "eight"}, "rows must be an integer"),
        ({"dtype": "fp64"}, "unknown exl3 option"),
        ({"path": "served"}, "path=served is the default"),
        ({"path": "sideways"}, "path must be served or forward"),
        ({"path": "forward", "rows": "8"}, "path=forward takes no option"),
        ({"path": "forward", "patches": "gdn-state-fp32"}, "patches must be none"),
    ],
)
def test_configuration_options_refused(options, message):
    with pytest.raises(ValueError, match=message):
        gate.configuration_options(options)


def test_backend_options_of_the_patches():
    assert gate.backend_options(("fixed-rows-8", "gdn-state-fp32")) == {
        "fixed_rows": 8, "gdn_state_fp32": True, "prefill_chunk": 2048, "rows_gemm": False, "gdn_ba": False,
    }  # fmt: skip
    # the kernel is a configuration's choice, never the process's registry switch
    assert gate.backend_options(("fixed-rows-8", "gdn-state-fp32", "rows-gemm"))["rows_gemm"] is True
    tree = gate.backend_options(("gdn-state-fp32", "tree-verify"))
    assert tree["tree"] is True and tree["tree_rows"] == 16 and tree["fixed_rows"] is None
    assert tree["gdn_ba"] is False  # a floor never follows the registry switch either
    assert gate.backend_options(("gdn-ba", "gdn-state-fp32", "tree-verify"))["gdn_ba"] is True
    assert gate.backend_options(("gdn-state-fp32", "prefill-chunk-8192"))["prefill_chunk"] == 8192
    assert set(gate.MODEL_ONLY_PATCHES) <= set(gate.PATCHES)


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (("tree-verify",), "needs gdn-state-fp32"),
        (("fixed-rows-8", "gdn-state-fp32", "tree-verify"), "replaces fixed-rows-8"),
        (("fixed-rows-8", "gdn-ba", "gdn-state-fp32"), "needs tree-verify"),
        (("exl3-attn-hadamard-fold", "fixed-rows-8", "gdn-state-fp32"), "needs tree-verify"),
    ],
)
def test_backend_options_refused(names, message):
    with pytest.raises(ValueError, match=message):
        gate.backend_options(names)


@pytest.mark.parametrize("on", [False, True])
def test_fold_configuration_must_match_the_process_switch(monkeypatch, on):
    """The fold is process-wide: a tree configuration names it exactly when the process runs with it."""
    from elpis.exl3 import tree_attention

    monkeypatch.setenv("ELPIS_PATCH_ATTN_HADAMARD_FOLD", "1" if on else "0")
    tree_attention.hadamard_fold_default.cache_clear()
    try:
        tree = ("gdn-state-fp32", "tree-verify")
        with_fold, without = (gate.FOLD_PATCH, *tree), tree
        gate._check_fold_switch(with_fold if on else without)  # matches: accepted
        want = "ELPIS_PATCH_ATTN_HADAMARD_FOLD=" + ("0" if on else "1")
        with pytest.raises(ValueError, match=want):
            gate._check_fold_switch(without if on else with_fold)
    finally:
        tree_attention.hadamard_fold_default.cache_clear()


def test_op_options_and_spec():
    chosen = gate.op_options({})
    assert chosen.patches == tuple(sorted(gate.PATCHES))
    assert (chosen.tokens, chosen.layers) == (gate.DEFAULT_TOKENS, 2)
    assert chosen.spec == (
        "exl3-ops:layers=2,patches=exl3-attn-hadamard-fold+exl3-int8-gemv-off+fixed-rows-8+gdn-ba+gdn-state-fp32+"
        "prefill-chunk-8192+rows-gemm+tree-verify,tokens=1280"
    )
    assert gate.op_options({"patches": "none", "tokens": "512"}).spec == (
        "exl3-ops:layers=2,patches=none,tokens=512"
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"tokens": "8"}, "tokens must be an integer 32..16384"),
        ({"layers": "0"}, "layers must be an integer 1..64"),
        ({"patches": "x"}, "unknown patch"),
        ({"rows": "8"}, "unknown exl3 op option"),
    ],
)
def test_op_options_refused(options, message):
    with pytest.raises(ValueError, match=message):
        gate.op_options(options)


# --- refusals without a GPU ------------------------------------------------------------------------------


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def _write_tokenizer(directory: Path, tokens: int) -> None:
    """A word-level tokenizer.json with `tokens` ids."""
    from tokenizers import Tokenizer, models

    tokenizer = Tokenizer(models.WordLevel({f"t{i}": i for i in range(tokens)}, unk_token="t0"))
    tokenizer.save(str(directory / "tokenizer.json"))


def _point_eos_into(model: Path, eos: int) -> None:
    """Replace the (linked) configs by copies whose end ids exist in a small test tokenizer."""

    def rewrite(node: object) -> object:
        if isinstance(node, dict):
            return {k: eos if k == "eos_token_id" else rewrite(v) for k, v in node.items()}
        return node

    for name in ("config.json", "generation_config.json"):
        path = model / name
        if path.exists():
            data = rewrite(json.loads(path.read_text()))
            path.unlink()
            path.write_text(json.dumps(data))


def _model_dir(directory: Path, vocab: int, tokens: int) -> Path:
    """A directory with a config.json of `vocab` logits and a `tokens`-id tokenizer.json."""
    directory.mkdir(parents=True, exist_ok=True)
    _write_tokenizer(directory, tokens)
    (directory / "config.json").write_text(json.dumps({"vocab_size": vocab, "hidden_size": 64}))
    return directory


def test_gate_ops_refuse_without_cuda(no_cuda, tmp_path):
    with pytest.raises(ValueError, match="needs a CUDA GPU"):
        gate.gate_ops(_model_dir(tmp_path, 100, 100), {})


def test_refuses_without_exllamav3(monkeypatch):
    if importlib.util.find_spec("exllamav3") is not None:
        pytest.skip("exllamav3 is installed on this machine")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ValueError, match="needs exllamav3"):
        gate.require_gpu()


def test_configuration_refuses_without_cuda(no_cuda, tmp_path):
    with pytest.raises(ValueError, match="needs a CUDA GPU"):
        make_configuration("exl3:patches=none", _model_dir(tmp_path, 100, 100))


def test_options_are_checked_before_the_gpu(no_cuda, tmp_path):
    with pytest.raises(ValueError, match="unknown patch"):
        gate.gate_ops(tmp_path, {"patches": "bogus"})
    with pytest.raises(ValueError, match="unknown exl3 option"):
        gate.configuration(tmp_path, {"bits": "4"})


def test_gate_ops_need_a_model_directory(tmp_path):
    with pytest.raises(ValueError, match="need --model"):
        gate.gate_ops(None, {})
    with pytest.raises(ValueError, match=r"no config\.json"):
        gate.gate_ops(tmp_path, {})


def _gate(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    gate_cli.add_arguments(parser)
    return gate_cli.run(parser.parse_args(argv))


def test_cli_reports_missing_gpu(no_cuda, tmp_path, capsys):
    model = _model_dir(tmp_path / "m", 100, 100)
    assert _gate(["op", "--backend", "exl3", "--model", str(model), "--out", str(tmp_path / "o.json")]) == 2
    err = capsys.readouterr().err
    assert "needs a CUDA GPU" in err and "Traceback" not in err
    assert not (tmp_path / "o.json").exists()


def test_operand_sequence(tmp_path):
    from tokenizers import Tokenizer, models

    ids, source = gate._sequence(tmp_path, {"vocab_size": 500, "synthetic": True}, 64)
    assert len(ids) == 64 and max(ids) < 500 and "synthetic" in source
    assert gate._sequence(tmp_path, {"vocab_size": 500, "synthetic": True}, 64)[0] == ids  # fixed
    # a word-level tokenizer: every WikiText-2 line is one unknown word, id 7 (fits) or 150 (does not)
    for unk, vocab, expect in ((7, 100, "WikiText-2"), (150, 100, "exceed")):
        model = tmp_path / f"unk{unk}"
        model.mkdir()
        Tokenizer(models.WordLevel({"a": 0, "<unk>": unk}, unk_token="<unk>")).save(
            str(model / "tokenizer.json")
        )
        ids, source = gate._sequence(model, {"vocab_size": vocab}, 64)
        assert len(ids) == 64 and expect in source and max(ids) < vocab
        if expect == "WikiText-2":
            assert set(ids) == {7}
    with pytest.raises(ValueError, match="cannot tokenize WikiText-2"):
        gate._sequence(tmp_path / "missing", {"vocab_size": 100}, 64)


def test_compared_width_is_the_narrower_of_tokenizer_and_logits(tmp_path):
    assert gate._compared_width(_model_dir(tmp_path / "fits", 128, 100)) == 100  # padded logits
    assert gate._compared_width(_model_dir(tmp_path / "wide", 128, 200)) == 128  # synthetic: wide tokenizer


# --- the fp64 evaluations, against independent formulations ------------------------------------------------


def _sylvester(n: int) -> torch.Tensor:
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(n)


def test_exact_weight_is_the_dense_product():
    gen = torch.Generator().manual_seed(0)
    k, n, size = 256, 384, 128
    decoded = torch.randn(k, n, generator=gen).half()
    suh = (torch.randint(0, 2, (k,), generator=gen) * 2 - 1).half()
    svh = (torch.randn(n, generator=gen) * 0.05).half()
    had = _sylvester(size)
    w = gate.exact_weight(decoded, suh, svh, had)
    left = torch.block_diag(*[had] * (k // size))
    right = torch.block_diag(*[had] * (n // size))
    dense = torch.diag(suh.double()) @ left @ decoded.double() @ right @ torch.diag(svh.double())
    assert w.dtype == torch.float64
    torch.testing.assert_close(w, dense, rtol=1e-12, atol=1e-12)
    # the input side: y = had(x * suh) @ decoded, then had, then * svh (what the kernels compute)
    x = torch.randn(3, k, generator=gen, dtype=torch.float64)
    y = (((x * suh.double()) @ left) @ decoded.double() @ right) * svh.double()
    torch.testing.assert_close(x @ w, y, rtol=1e-10, atol=1e-10)


def test_exact_attention_matches_a_loop():
    gen = torch.Generator().manual_seed(1)
    context, count, heads, kv_heads, dim = 5, 3, 6, 2, 16
    q = torch.randn(1, count, heads, dim, generator=gen).half()
    keys = torch.randn(context + count, kv_heads, dim, generator=gen).half()
    values = torch.randn(context + count, kv_heads, dim, generator=gen).half()
    scale = 0.3
    out = gate.exact_attention(q, keys, values, context, scale)
    assert out.shape == (1, count, heads, dim) and out.dtype == torch.float64
    group = heads // kv_heads
    for r in range(count):
        for h in range(heads):
            visible = context + r + 1
            s = keys[:visible, h // group].double() @ q[0, r, h].double() * scale
            expect = torch.softmax(s, 0) @ values[:visible, h // group].double()
            torch.testing.assert_close(out[0, r, h], expect, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="cached positions"):
        gate.exact_attention(q, keys[:-1], values[:-1], context, scale)


def test_exact_rmsnorm():
    gen = torch.Generator().manual_seed(2)
    x, r = torch.randn(2, 4, 32, generator=gen), torch.randn(2, 4, 32, generator=gen)
    w = torch.randn(32, generator=gen).to(torch.bfloat16)
    y = gate.exact_rmsnorm(x, r, w, 1e-6, 1.0, 1.0)
    h = x.double() + r.double()
    expect = h / torch.sqrt((h * h).mean(-1, keepdim=True) + 1e-6) * (w.double() + 1.0)
    torch.testing.assert_close(y, expect, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(
        gate.exact_rmsnorm(x, None, w, 1e-5, 2.0, 0.0),
        x.double() / torch.sqrt((x.double() ** 2).mean(-1, keepdim=True) + 1e-5) * 2.0 * w.double(),
    )


def _deltanet_call(steps: int, nk: int = 2, nv: int = 4, dk: int = 8, dv: int = 8) -> dict:
    gen = torch.Generator().manual_seed(3)
    return {
        "mixed_qkv": torch.randn(1, steps, 2 * nk * dk + nv * dv, generator=gen).to(torch.bfloat16),
        "g": -torch.rand(1, steps, nv, generator=gen),
        "beta": torch.rand(1, steps, nv, generator=gen).to(torch.bfloat16),
        "num_k_heads": nk,
        "num_v_heads": nv,
        "k_dim": nk * dk,
        "v_dim": nv * dv,
        "k_head_dim": dk,
        "v_head_dim": dv,
    }


def test_exact_delta_rule_is_the_gated_delta_rule():
    """Against a direct statement of the rule: per v head h (k head h // 2), q and k L2-normalised, q
    scaled by dk^-1/2; S <- exp(g) S; S <- S + k (beta (v - S^T k))^T; o = S^T q."""
    steps, nk, nv, dk, dv = 12, 2, 4, 8, 8
    call = _deltanet_call(steps, nk, nv, dk, dv)
    x = call["mixed_qkv"][0].double()
    state = torch.zeros(nv, dk, dv, dtype=torch.float64)
    outputs, states = [], [state.clone()]
    for t in range(steps):
        out_t = []
        for h in range(nv):
            kh = h // (nv // nk)
            q = x[t, kh * dk : (kh + 1) * dk]
            k = x[t, nk * dk + kh * dk : nk * dk + (kh + 1) * dk]
            v = x[t, 2 * nk * dk + h * dv : 2 * nk * dk + (h + 1) * dv]
            q = q / torch.sqrt((q * q).sum() + 1e-6) / math.sqrt(dk)
            k = k / torch.sqrt((k * k).sum() + 1e-6)
            s = state[h] * math.exp(float(call["g"][0, t, h]))
            s = s + torch.outer(k, float(call["beta"][0, t, h]) * (v - s.T @ k))
            state[h] = s
            out_t.append(s.T @ q)
        outputs.append(torch.stack(out_t))
        states.append(state.clone())
    expect = torch.stack(outputs)
    exact = gate.ExactDeltaRule(call)
    # cells in any order give the same windows and states as one pass
    for context, count in [(8, 4), (0, 3), (5, 2), (3, 9)]:
        out, final = exact.window(context, count)
        torch.testing.assert_close(out, expect[context : context + count], rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(final, states[context + count], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(exact.state(5), states[5], rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="were recorded"):
        exact.state(steps + 1)


def test_fitted_grid():
    assert gate.fitted_grid((256, 1024), (1, 4, 256), 1280) == ((256, 1024), (1, 4, 256))
    assert gate.fitted_grid((256, 1024), (1, 4, 256), 384) == ((256,), (1, 4))
    assert gate.fitted_grid((0,), (1, 1024), 512) == ((0,), (1,))
    assert gate.fitted_grid((1024,), (1,), 512) is None


def _library(tmp_path: Path, source: str) -> str:
    import shutil
    import subprocess

    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler")
    (tmp_path / "lib.c").write_text(source)
    out = tmp_path / "lib.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(out), str(tmp_path / "lib.c")], check=True)
    return str(out)


def test_int8_switch_rereads_the_setting(tmp_path, monkeypatch):
    """The switch works on the extension's exported flag: inside `off()` the setting reads 0 and the flag
    is cleared (the next GEMM reads it again); afterwards the previous setting is back, the flag cleared."""
    import ctypes

    path = _library(
        tmp_path,
        "#include <stdbool.h>\n#include <stdlib.h>\nbool _exl3_gemv_int8_mode_chk = true;\n"
        'int mode(void) { const char* e = getenv("EXL3_INT8_GEMV"); '
        "_exl3_gemv_int8_mode_chk = true; return e ? atoi(e) : 2; }\n",
    )
    monkeypatch.delenv("EXL3_INT8_GEMV", raising=False)
    switch = gate.Int8GemvSwitch(path)
    mode = ctypes.CDLL(path).mode
    assert switch.was_read() and mode() == 2
    with switch.off():
        assert not switch.was_read()
        assert mode() == 0 and switch.was_read()
    assert not switch.was_read() and "EXL3_INT8_GEMV" not in os.environ
    assert mode() == 2
    monkeypatch.setenv("EXL3_INT8_GEMV", "1")
    with switch.off():
        assert mode() == 0
    assert os.environ["EXL3_INT8_GEMV"] == "1" and mode() == 1


def test_int8_switch_refuses_a_library_without_the_flag(tmp_path):
    path = _library(tmp_path, "int unrelated = 1;\n")
    with pytest.raises(ValueError, match="does not export _exl3_gemv_int8_mode_chk"):
        gate.Int8GemvSwitch(path)


def _op(stock, candidates) -> gate.GateOp:
    from elpis.gate.ops import OpInputs

    def inputs(context, rows):
        yield OpInputs({"x": torch.full((rows, 4), float(context + 1))}, label="only")

    return gate.GateOp(
        "toy", "toy op", stock, lambda o: o.tensors["x"].double() * 2, inputs, (0, 5), (1, 3), candidates
    )


def test_probe_leaves_out_what_fails():
    def double(o):
        return o.tensors["x"] * 2

    def fails_on_three_rows(o):
        if o.tensors["x"].shape[0] == 3:
            raise RuntimeError("no kernel for 3 rows")
        return double(o)

    probed, notes = gate._probe(_op(double, {"good": double, "bad": fails_on_three_rows}))
    assert probed is not None and set(probed.candidates) == {"good"}
    assert notes == ["candidate bad of op toy left out: context 0 rows 3: RuntimeError: no kernel for 3 rows"]
    probed, notes = gate._probe(_op(fails_on_three_rows, {"good": double}))
    assert probed is None and notes == [
        "op toy left out: context 0 rows 3: RuntimeError: no kernel for 3 rows"
    ]
    probed, notes = gate._probe(_op(double, {"wide": lambda o: torch.zeros(9)}))
    assert set(probed.candidates) == set() and "differs from the fp64 shape" in notes[0]


def test_rows_and_padding():
    x = torch.arange(10.0).reshape(1, 5, 2)
    torch.testing.assert_close(gate._rows(x, 1, 2, "t"), x[:, 1:3])
    with pytest.raises(ValueError, match="raise the tokens option"):
        gate._rows(x, 4, 2, "t")
    padded = gate._padded(x[:, :3], 8)
    assert padded.shape == (1, 8, 2)
    torch.testing.assert_close(padded[:, :3], x[:, :3])
    torch.testing.assert_close(padded[:, 3:], x[:, 2:3].expand(1, 5, 2))
    assert gate._padded(x, 4) is x


# --- GPU ---------------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gate_op_on_the_small_model(small, tmp_path, capsys):
    """`elpis gate op --backend exl3`: every op measured, stock and every patch, errors recorded. With
    ELPIS_GATE_OP_OUT set (the device script) the default grid is measured and written there, so the
    committed measurement is the one these checks passed on; otherwise a small grid."""
    given = os.environ.get("ELPIS_GATE_OP_OUT")
    out = Path(given) if given else tmp_path / "op.json"
    argv = ["op", "--backend", "exl3", "--model", str(small / "target"), "--option", "patches=all"]
    argv += ["--out", str(out)]
    if not given:
        argv += ["--option", "tokens=384", "--contexts", "256", "--rows", "1,2,64"]
    code = _gate(argv)
    err = capsys.readouterr().err
    assert code == 0, err
    assert "left out" not in err, err  # the reasons of what was left out, in the failure report
    record = json.loads(out.read_text())
    assert record["backend"] == "exl3" and record["format"] == "elpis-gate-op/1"
    assert {c["op"] for c in record["cells"]} == set(gate.OP_NAMES)
    for cell in record["cells"]:
        assert cell["samples"] > 0
        for name, stats in cell["impls"].items():
            assert all(math.isfinite(stats[k]) for k in ("mean", "p99", "max")), (cell["op"], name)
            assert stats["count"] > 0
        # O(1) errors would mean the fp64 evaluation computes other math than the kernels (the max is left
        # free: a near-zero fp16 state row can lose most of its digits to subnormals)
        assert cell["impls"]["stock"]["mean"] < 0.05 and cell["impls"]["stock"]["p99"] < 0.25, cell
    assert set(record["bar"]) == set(gate.PATCHES) - set(gate.MODEL_ONLY_PATCHES)
    for name, bar in record["bar"].items():
        assert bar["cells"] > 0 and isinstance(bar["pass"], bool), name
    # a candidate that cannot change a cell's arithmetic equals stock there (more than 8 rows: no padding;
    # more than 2 rows: the int8 GEMV never runs)
    checked = 0
    for cell in record["cells"]:
        if cell["op"] == "linear" and 16 < cell["rows"] <= 144:
            assert cell["impls"]["fixed-rows-8"] == cell["impls"]["stock"]
            assert cell["impls"]["exl3-int8-gemv-off"] == cell["impls"]["stock"]
            checked += 1
        if cell["op"] == "linear" and 8 < cell["rows"] <= 16:
            assert cell["impls"]["fixed-rows-8"] == cell["impls"]["stock"]
            checked += 1
    assert checked


@pytest.mark.gpu
def test_configuration_refuses_text_ids_past_a_narrower_head(small):
    # the synthetic target carries the full Qwen tokenizer over a 32K vocabulary: ids past it are refused
    made = make_configuration("exl3:patches=none", small / "target")
    assert made.vocab_size == 32768
    with pytest.raises(ValueError, match="outside the vocabulary"):
        made.teacher_forced([1, 2, 40000, 3])


@pytest.mark.gpu
def test_forward_configuration_agrees_with_the_served_path(small):
    """path=forward (no cache, one pass) and the served verify path compute the same model: top-1 agrees
    almost everywhere and KL is small (different kernels, fp16 K/V vs the 3-bit cache)."""
    tokens = [(i * 7919) % 32000 + 5 for i in range(96)]
    forward = make_configuration("exl3:path=forward", small / "target")
    assert forward.spec == "exl3:patches=none,path=forward"
    a = forward.teacher_forced(tokens)
    b = make_configuration("exl3:patches=none", small / "target").teacher_forced(tokens)
    assert a.shape == b.shape == (95, 32768)
    agree = (a.argmax(-1) == b.argmax(-1)).float().mean().item()
    assert agree > 0.8, agree
    assert forward.greedy(tokens[:10], 3) == forward.greedy(tokens[:10], 3)


@pytest.mark.gpu
def test_configuration_teacher_forces_and_decodes(small, tmp_path):
    """The served backend as a configuration (elpis patches), on a copy of the small target whose
    tokenizer fits its vocabulary."""
    model = tmp_path / "model"
    model.mkdir()
    for f in (small / "target").iterdir():
        if f.name not in ("tokenizer.json", "tokenizer_config.json"):
            (model / f.name).symlink_to(f)
    _write_tokenizer(model, 1000)
    _point_eos_into(model, 2)
    made = make_configuration("exl3:patches=fixed-rows-8+gdn-state-fp32,rows=8", model)
    assert made.spec == "exl3:patches=fixed-rows-8+gdn-state-fp32,rows=8"
    assert made.vocab_size == 1000
    tokens = list(range(3, 40))
    logits = made.teacher_forced(tokens)
    assert logits.shape == (len(tokens) - 1, 1000) and bool(torch.isfinite(logits).all())
    assert len(made.greedy(tokens[:10], 5)) == 5


def test_the_fold_is_on_by_default_only_with_a_pass_verdict():
    """A numerics change that the registry serves by default carries a PASS on file under its rule."""
    from elpis.exl3.patches import load_registry
    from elpis.gate.verdicts import latest

    entry = next(p for p in load_registry() if p.id == gate.FOLD_PATCH)
    if entry.default:
        verdict = latest(gate.FOLD_PATCH)
        assert verdict is not None and verdict.ships, f"{gate.FOLD_PATCH} is on by default without a PASS"
        assert verdict.rule_id == "exl3-small-tree-r4"
