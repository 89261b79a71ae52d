"""The registry patch exl3-rows-gemm (elpis.exl3.rows_gemm_patch): refused with the reason when switched off;
on the GPU, a model loaded in tree mode with rows_gemm=True routes its linears through elpis's GEMM (the
kernel is really called during an eager tree verify; chain mode keeps ExLlamaV3's C++ block graphs, which no
wrapper reaches), the projections sharing an input run as one kernel call per group and each member gets its
own output, and generation stays lossless: the DFlash2 draft on or off, and drafts that are accepted, give
the plain greedy tokens.
"""

from __future__ import annotations

import pytest

from elpis.exl3 import rows_gemm_patch


def test_refused_when_the_registry_patch_is_off(monkeypatch) -> None:
    monkeypatch.setenv("ELPIS_PATCH_ROWS_GEMM", "0")
    monkeypatch.setattr(rows_gemm_patch, "_originals", {})
    with pytest.raises(RuntimeError, match="exl3-rows-gemm, which is switched off"):
        rows_gemm_patch.require_patch()
    with pytest.raises(RuntimeError, match="switched off"), rows_gemm_patch.loading(True):
        pass
    with rows_gemm_patch.loading(False):  # a model loaded without the kernel needs no patch
        pass


@pytest.fixture(scope="module")
def patched(small):
    from elpis.exl3 import load_backend

    rows_gemm_patch.install()
    # tree mode (elpis serve's default with a draft), eager tree verifies so that the wrapper's calls are seen
    backend = load_backend(
        small / "target", small / "draft", max_context=65536, model_id="small", host_cache_gib=1.0,
        tree=True, tree_graphs=False, rows_gemm=True,
    )  # fmt: skip
    yield backend


@pytest.mark.gpu
def test_the_kernel_serves_the_linears(patched) -> None:
    from elpis.exl3 import walk_modules
    from tests.exl3.test_gpu import prompt

    model = patched.engine.model
    marked = [
        m for m in walk_modules(model) if getattr(getattr(m, "inner", None), rows_gemm_patch.MARK, False)
    ]
    assert marked, "no linear of the target was routed to the kernel"
    ids = prompt(600, 11, patched.info.vocab_size)
    before = rows_gemm_patch.calls["rows_gemm"]
    patched.begin(ids)
    try:
        patched.verify([ids[-1], 5, 6, 7], [-1, 0, 0, 1])
    finally:
        patched.finish()
    assert rows_gemm_patch.calls["rows_gemm"] - before >= len(marked) // 2, (
        "the verify did not reach the kernel"
    )
    # every member of every group took its output (a kept output is current only by that call structure)
    for loaded in (model, patched.engine.draft):
        assert all(not g.kept for g in rows_gemm_patch.groups(loaded)), "a group member was not called"


@pytest.mark.gpu
def test_each_member_of_a_group_gets_its_own_linear(patched) -> None:
    import torch

    model = patched.engine.model
    groups = rows_gemm_patch.groups(model)
    kinds = {len(g.members) for g in groups}
    # every attention (Q, K, V), Gated DeltaNet (qkv, z) and MLP (gate, up) layer of the target (and of an MTP
    # block, where the checkpoint has one)
    assert len(groups) >= 2 * model.config.num_hidden_layers and kinds == {2, 3}, (len(groups), kinds)
    stock = rows_gemm_patch._originals["forward"]
    torch.manual_seed(0)
    for group in groups[:6]:
        x = torch.randn(1, 8, group.members[0].in_features, dtype=torch.half, device="cuda")
        before = rows_gemm_patch.calls["groups"]
        ours = [m.forward(x, {}) for m in reversed(group.members)]  # any member may come first
        assert rows_gemm_patch.calls["groups"] - before == 1, "one kernel call per group"
        assert not group.kept, "every member took its kept output"
        for m, y in zip(reversed(group.members), ours, strict=True):
            want = stock(m, x, {}).float()
            assert y.shape == want.shape
            rel = ((y.float() - want).norm() / want.norm()).item()
            assert rel < 1e-2, f"{m.key}: relative error {rel} against ExLlamaV3's GEMM"
        # outside inference mode an input changed in place is computed afresh
        group.members[0].forward(x, {})
        x.mul_(0.5)
        y = group.members[1].forward(x, {})
        assert rows_gemm_patch.calls["groups"] - before == 3
        want = stock(group.members[1], x, {}).float()
        assert ((y.float() - want).norm() / want.norm()).item() < 1e-2


@pytest.mark.gpu
def test_lossless_with_the_kernel(patched) -> None:
    from tests.exl3.test_gpu import ReplayDrafter, oracle_generate, prompt

    ids = prompt(1500, 12, patched.info.vocab_size)
    plain, _, _ = oracle_generate(patched, ids, 48)
    drafted, _, _ = oracle_generate(patched, ids, 48, drafter=patched.drafter)
    replayed, _, rounds = oracle_generate(patched, ids, 48, drafter=ReplayDrafter(len(ids), plain))
    assert max(rounds) > 1, "the replay drafter should have been accepted"
    assert drafted == plain, "the DFlash2 draft changed the output"
    assert replayed == plain, "accepted drafts changed the output"
