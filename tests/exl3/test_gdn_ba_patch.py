"""The patch exl3-gdn-ba (`elpis.exl3.gdn_ba_patch`): the Gated DeltaNet gate projections of a tree verify
in one kernel call.

CPU: what the patch refuses (a process without the registry patch, layers the kernel cannot serve) and that
an unmarked layer is left alone. GPU, on the synthetic --small checkpoint (ELPIS_SMALL_DIR, else written to a
temporary directory): a backend loaded with gdn_ba=True marks every Gated DeltaNet layer, its tree verifies
call the kernel (eager, and through captured graphs), a row's logits are bit-identical to the plain decoding
step of its path, and tree speculation (known-continuation trees and DFlash2 top-k trees) gives the tokens of
plain decoding; how far its logits move from the backend without the patch is logged.
"""

from __future__ import annotations

import types

import pytest

from elpis.exl3 import gdn_ba_patch
from tests.exl3.test_gpu import decoder  # noqa: F401  (a fixture)


class _Linear:
    """A linear whose inner weight class is named `kind` (the patch checks ExLlamaV3's class by name)."""

    def __init__(self, kind: str, bias: object = None) -> None:
        methods = {"get_bias_tensor": lambda s: bias, "get_weight_tensor": lambda s: None}
        self.inner = type(kind, (), methods)()


def _layer(**overrides: object) -> types.SimpleNamespace:
    fields = {"layer_idx": 3, "kda": False, "ba_proj": None, "b_proj": _Linear("LinearFP16"),
              "a_proj": _Linear("LinearFP16")}  # fmt: skip
    return types.SimpleNamespace(**{**fields, **overrides})


def test_a_process_without_the_registry_patch_is_refused(monkeypatch) -> None:
    monkeypatch.setattr(gdn_ba_patch, "_installed", [])
    monkeypatch.setenv("ELPIS_PATCH_GDN_BA", "0")
    with pytest.raises(RuntimeError, match=r"needs the registry patch exl3-gdn-ba, which is switched off"):
        gdn_ba_patch.require_patch()
    monkeypatch.setenv("ELPIS_PATCH_GDN_BA", "1")
    with pytest.raises(RuntimeError, match=r"not applied"):
        gdn_ba_patch.require_patch()
    gdn_ba_patch.install()
    gdn_ba_patch.require_patch()  # installed: accepted


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"kda": True}, "not a split-projection"),
        ({"ba_proj": object()}, "not a split-projection"),
        ({"b_proj": _Linear("LinearEXL3")}, "b_proj is not an fp16 linear"),
        ({"a_proj": types.SimpleNamespace()}, "a_proj is not an fp16 linear"),
        ({"a_proj": _Linear("LinearFP16", bias=object())}, "a_proj has a bias"),
    ],
)
def test_layers_the_kernel_cannot_serve_are_refused(overrides: dict, message: str) -> None:
    with pytest.raises(RuntimeError, match=f"layer 3.*{message}|{message}"):
        gdn_ba_patch._gate_weights(_layer(**overrides))


def test_a_model_without_gated_deltanet_layers_is_refused(monkeypatch) -> None:
    monkeypatch.setattr(gdn_ba_patch, "_installed", [True])
    dense = types.SimpleNamespace(modules=[types.SimpleNamespace(modules=[])])
    with pytest.raises(RuntimeError, match="no Gated DeltaNet layers"):
        gdn_ba_patch.mark(dense)


def test_the_operand_is_exllamav3s_merged_buffer_where_the_layer_has_one(monkeypatch) -> None:
    import torch

    from elpis.exl3 import gdn_ba

    hidden, heads = 16, 4
    b, a = torch.randn(hidden, heads).half(), torch.randn(hidden, heads).half()
    b_linear, a_linear = _Linear("LinearFP16"), _Linear("LinearFP16")
    type(b_linear.inner).get_weight_tensor = lambda s: b
    type(a_linear.inner).get_weight_tensor = lambda s: a
    # transposed_weights wants CUDA tensors; its layout on the CPU
    monkeypatch.setattr(gdn_ba, "transposed_weights", lambda wb, wa: torch.cat((wb.t(), wa.t())).contiguous())
    expected = torch.cat((b.t(), a.t()))

    with torch.inference_mode():  # as ExLlamaV3 allocates it: an inference tensor
        merged = torch.zeros(2 * heads, hidden, dtype=torch.half)
    layer = _layer(b_proj=b_linear, a_proj=a_linear, ba_weight_t=merged, ba_weight_filled=False)
    assert gdn_ba_patch._operand(layer) is merged
    assert torch.equal(merged, expected) and layer.ba_weight_filled is True

    for other in (None, torch.zeros(2 * heads, hidden + 1, dtype=torch.half), torch.zeros(2 * heads, hidden)):
        layer = _layer(b_proj=b_linear, a_proj=a_linear, ba_weight_t=other, ba_weight_filled=False)
        got = gdn_ba_patch._operand(layer)  # absent, another shape or dtype: a tensor of our own
        assert got is not other and torch.equal(got, expected) and layer.ba_weight_filled is False
    biased = _layer(b_proj=b_linear, a_proj=a_linear, ba_weight_t=merged.clone(), ba_bias=torch.zeros(8))
    assert gdn_ba_patch._operand(biased) is not biased.ba_weight_t  # its fill would also write the bias


def test_an_unmarked_layer_is_left_alone() -> None:
    layer = _layer()
    forwards = (layer.b_proj.__dict__.get("forward"), layer.a_proj.__dict__.get("forward"))
    with gdn_ba_patch.projections(layer):
        assert (vars(layer.b_proj).get("forward"), vars(layer.a_proj).get("forward")) == forwards


# --- GPU -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def backend(small):
    from elpis.exl3 import load_backend

    gdn_ba_patch.install()  # what ELPIS_PATCH_GDN_BA=1 makes patches.apply_all do
    calls_before_load = gdn_ba_patch.calls["gdn_ba"]
    b = load_backend(
        small / "target", small / "draft", max_context=65536, model_id="small", host_cache_gib=1.0, tree=True,
        gdn_ba=True,
    )  # fmt: skip
    b.prefix.enabled = False
    b.gdn_ba_calls_at_load = gdn_ba_patch.calls["gdn_ba"] - calls_before_load  # the graphs captured at load
    yield b


@pytest.mark.gpu
def test_every_gdn_layer_is_marked_and_served(backend) -> None:
    from elpis.exl3 import walk_modules
    from tests.exl3.test_gpu import prompt
    from tests.exl3.test_tree_verify import plain, tree_generate

    layers = [m for m in walk_modules(backend.engine.model) if type(m).__name__ == "GatedDeltaNet"]
    assert layers and all(getattr(m, gdn_ba_patch.MARK, None) is not None for m in layers)
    shared = [getattr(m, "ba_weight_t", None) is getattr(m, gdn_ba_patch.MARK) for m in layers]
    print(f"gdn ba operand shared with ExLlamaV3's merged buffer on {sum(shared)} of {len(layers)} layers")
    assert all(shared[i] for i, m in enumerate(layers) if getattr(m, "ba_weight_t", None) is not None)
    # load_backend captures every verify graph at load (the served configuration), so the kernel's calls
    # through the hook happen there: the eager warm-up and the capture of each verify; replays run no Python
    assert backend.gdn_ba_calls_at_load > 0, "no captured tree verify called the kernel"
    tree_generate(backend, prompt(300, 3, backend.info.vocab_size), 4, plain)
    for m in layers:
        assert "forward" not in vars(m.b_proj) and "forward" not in vars(m.a_proj), "a verify left its hook"


@pytest.mark.gpu
@pytest.mark.parametrize("run", (8, 16))
def test_rows_stay_invariant_and_speculation_lossless(backend, run) -> None:
    """tests/exl3/test_tree_verify.py's row-invariance and lossless checks, on the patched backend (its
    verifies replayed from graphs after each key's warm-up)."""
    from tests.exl3.test_tree_verify import SIZES, check_lossless, check_row_invariance, run_rows

    with run_rows(backend, run):
        check_row_invariance(backend, [n for n in (5, 8, 12, 16) if n <= run])
        check_lossless(backend, [n for n in SIZES if n <= run])


@pytest.mark.gpu
def test_product_path_with_the_patch(backend, decoder) -> None:  # noqa: F811
    from tests.exl3.test_tree_verify import test_product_path_with_draft_trees

    test_product_path_with_draft_trees(backend, decoder)


@pytest.mark.gpu
def test_logits_against_the_backend_without_the_patch(backend) -> None:
    """How far the patch moves a verify's logits (logged; the quality gate judges it). Both verifies run
    eagerly: a replay would run what its capture recorded, marked or not."""
    import torch

    from elpis.exl3 import walk_modules
    from tests.exl3.test_gpu import prompt
    from tests.exl3.test_tree_verify import log, tree_logits

    vocab = backend.info.vocab_size
    ids = prompt(800, 17, vocab)
    tokens = [ids[-1]] + [(ids[-1] + 37 * i) % vocab for i in range(1, 16)]
    parents = [-1] + [(r - 1) // 2 for r in range(1, 16)]
    graphs, backend.graphs = backend.graphs, None
    layers = [m for m in walk_modules(backend.engine.model) if type(m).__name__ == "GatedDeltaNet"]
    try:
        patched = tree_logits(backend, ids, tokens, parents).clone()
        kept = [vars(m).pop(gdn_ba_patch.MARK) for m in layers]  # unmarked: ExLlamaV3's two GEMMs
        try:
            stock = tree_logits(backend, ids, tokens, parents).clone()
        finally:
            for m, wt in zip(layers, kept, strict=True):
                setattr(m, gdn_ba_patch.MARK, wt)
    finally:
        backend.graphs = graphs
    diff = (patched - stock).abs().max().item()
    agree = (patched.argmax(-1) == stock.argmax(-1)).float().mean().item()
    log({"test": "gdn_ba_vs_cublas_logits", "max_abs_diff": diff, "argmax_agreement": agree})
    assert torch.isfinite(patched).all()
