"""The registry patch exl3-rows-gemm (elpis.exl3.rows_gemm_patch): refused with the reason when switched off;
on the CPU, a group of projections (with the format's float64 reference in place of the kernel) computes
once per input, gives each member its own output, recomputes for a changed input and keeps the asked dtype;
on the GPU, a model loaded in tree mode with rows_gemm=True routes its linears through elpis's GEMM (the
kernel is really called during an eager tree verify; chain mode keeps ExLlamaV3's C++ block graphs, which no
wrapper reaches), the projections sharing an input run as one kernel call per group and each member gets its
own output, and generation stays lossless: the DFlash2 draft on or off, and drafts that are accepted, give
the plain greedy tokens.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from elpis.exl3 import rows_gemm, rows_gemm_patch, trellis_ref


def reference_run(x: torch.Tensor, members: list[rows_gemm.Member]) -> list[torch.Tensor]:
    """A group call by the format's float64 reference on the CPU (what the kernel computes, exactly)."""
    out = []
    for m in members:
        trellis = m.trellis.numpy().view(np.uint16)
        y = trellis_ref.linear(
            x.double().numpy(), trellis, m.suh.numpy(), m.svh.numpy(), trellis.shape[2] // 16
        )
        out.append(torch.from_numpy(y).to(m.out_dtype))
    return out


def layer(k: int, n: int, seed: int, out_dtype: torch.dtype = torch.half) -> SimpleNamespace:
    """What a group reads of an EXL3 linear: its trellis, suh, svh, input width and default output dtype."""
    g = torch.Generator().manual_seed(seed)
    return SimpleNamespace(
        trellis=torch.randint(-32768, 32768, (k // 16, n // 16, 64), dtype=torch.int16, generator=g),
        suh=(torch.randint(0, 2, (k,), generator=g) * 2 - 1).half(),
        svh=(torch.rand(n, generator=g) / k**0.5).half(),
        in_features=k,
        default_out_dtype=out_dtype,
    )


def alone(linear: SimpleNamespace, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    member = rows_gemm.Member(linear.trellis, linear.suh, linear.svh, dtype)
    return reference_run(x.reshape(-1, linear.in_features), [member])[0].view(*x.shape[:-1], -1)


def test_a_group_computes_once_and_each_member_gets_its_own_output() -> None:
    layers = [layer(256, 128, 1), layer(256, 256, 2, torch.float), layer(256, 128, 3)]
    runs: list[int] = []
    group = rows_gemm_patch.Group(layers, run=lambda x, ms: runs.append(len(ms)) or reference_run(x, ms))
    x = torch.randn(1, 3, 256).half()
    order = (layers[1], layers[2], layers[0])  # any member may be called first
    ys = [group.output(m, x, None) for m in order]
    assert runs == [3] and not group.kept
    for m, y in zip(order, ys, strict=True):
        assert torch.equal(y, alone(m, x, m.default_out_dtype))
    # the same values in another tensor are computed afresh: a kept output answers only its own input
    other = x.clone()
    group.output(layers[0], x, None)
    assert torch.equal(group.output(layers[2], other, None), alone(layers[2], other, torch.half))
    assert runs == [3, 3, 3]


def test_a_kept_output_follows_its_input_and_the_asked_dtype() -> None:
    layers = [layer(128, 128, 4), layer(128, 256, 5, torch.float)]
    runs: list[int] = []
    group = rows_gemm_patch.Group(layers, run=lambda x, ms: runs.append(len(ms)) or reference_run(x, ms))
    x = torch.randn(2, 128).half()
    group.output(layers[0], x, None)
    x.mul_(0.5)  # changed in place after the compute: the kept output is stale
    assert torch.equal(group.output(layers[1], x, None), alone(layers[1], x, torch.float))
    assert len(runs) == 2
    # fp16 asked of a kept fp32 output: its rounding, as the kernel's own fp16 output would be
    group.output(layers[0], x, None)
    assert torch.equal(group.output(layers[1], x, torch.half), alone(layers[1], x, torch.float).half())
    assert len(runs) == 3
    # fp32 asked of a kept fp16 output cannot be recovered: computed afresh, and asked so from then on
    group.output(layers[1], x, None)
    y = group.output(layers[0], x, torch.float)
    assert y.dtype == torch.float and torch.equal(y, alone(layers[0], x, torch.float)) and len(runs) == 5
    group.output(layers[1], torch.randn(2, 128).half(), None)  # a new input: member 0 kept as it last asked
    assert group.kept[0].y.dtype == torch.float and len(runs) == 6
    with torch.inference_mode():  # inference tensors: kept outputs answer by identity alone
        xi = torch.randn(2, 128).half()
        group.output(layers[0], xi, None)
        assert torch.equal(group.output(layers[1], xi, None), alone(layers[1], xi, torch.float))
        assert len(runs) == 7


def test_eligible_tests_the_rows_before_the_weights_format(monkeypatch) -> None:
    # a prefill chunk calls every linear with thousands of rows: those calls must not pay format_ok's checks
    linear = SimpleNamespace(in_features=256, out_features=256, K=4, default_out_dtype=torch.half)
    x = SimpleNamespace(dtype=torch.half, is_cuda=True, shape=(1, 2048, 256), numel=lambda: 2048 * 256)
    x.dim = lambda: 3
    seen = []
    monkeypatch.setattr(rows_gemm_patch, "format_ok", lambda lin: seen.append(lin) or True)
    assert not rows_gemm_patch.eligible(linear, x, {}, None)
    assert seen == []
    x.shape, x.numel = (1, 16, 256), lambda: 16 * 256
    assert rows_gemm_patch.eligible(linear, x, {}, None) and seen == [linear]
    monkeypatch.setattr(rows_gemm_patch, "format_ok", lambda lin: False)
    assert not rows_gemm_patch.eligible(linear, x, {}, None)


def test_refused_when_the_registry_patch_is_off(monkeypatch) -> None:
    monkeypatch.setenv("ELPIS_PATCH_ROWS_GEMM", "0")
    monkeypatch.setattr(rows_gemm_patch, "_originals", {})
    with pytest.raises(RuntimeError, match="exl3-rows-gemm, which is switched off"):
        rows_gemm_patch.require_patch()
    with pytest.raises(RuntimeError, match="switched off"), rows_gemm_patch.loading(True):
        pass
    with rows_gemm_patch.loading(False):  # a model loaded without the kernel needs no patch
        pass


def test_a_channel_major_output_passes_through_the_gdn_forwards_cast_and_copy() -> None:
    """What the switch exl3-gdn-qkv-channel-major relies on: ExLlamaV3's Gated DeltaNet forward turns its
    qkv into `qkv.transpose(1, 2).to(torch.bfloat16).contiguous()` for the conv; handed the bf16 [1, rows, n]
    view of an [n, rows] buffer, that expression returns the buffer itself (no cast, no copy), which the tree
    conv then reads in place (gdn_tree.channel_major: the transposed view of a contiguous bf16 buffer)."""
    buffer = torch.randn(384, 16).to(torch.bfloat16)
    qkv = buffer.t().unsqueeze(0)  # [1, 16, 384], as rows_gemm_group returns a bf16 member, shaped as asked
    mixed = qkv.transpose(1, 2).to(torch.bfloat16).contiguous()
    assert mixed.data_ptr() == buffer.data_ptr() and torch.equal(mixed[0], buffer)
    assert mixed[0].t().stride() == (1, 16)


def test_channel_major_asks_bf16_for_its_linear_only_where_fp16_was_asked() -> None:
    lin, other = layer(128, 128, 6), layer(128, 128, 7, torch.float)
    with rows_gemm_patch.channel_major(lin):
        assert rows_gemm_patch._state.channel_major is lin
        assert rows_gemm_patch._channel_major_dtype(lin, None) == torch.bfloat16
        assert rows_gemm_patch._channel_major_dtype(lin, torch.half) == torch.bfloat16
        with pytest.raises(RuntimeError, match="replaces fp16"):
            rows_gemm_patch._channel_major_dtype(other, None)  # fp32 asked: not the GDN forward's qkv call
    assert getattr(rows_gemm_patch._state, "channel_major", None) is None


def reference_silu_mul(g, u, members, act=None):
    """The SiLU-and-multiply entry by reference on the CPU: act in fp16 from float64 arithmetic (not the
    kernel's fp16 operations: these tests check the wrapper's plumbing), written into `act` when given, then
    the GEMM."""
    a = (g.double() * torch.sigmoid(g.double()) * u.double()).half()
    if act is not None:
        act.copy_(a)
        a = act
    return reference_run(a, members), a


class FakeDown(SimpleNamespace):
    """What SiluMulThenDown reads of the down linear, with the kernel's format and mark."""


def fake_down(k: int, n: int, seed: int) -> FakeDown:
    lay = layer(k, n, seed)
    down = FakeDown(**vars(lay), out_features=n, K=4, bias=None, mul1=True, mcg=False)
    setattr(down, rows_gemm_patch.MARK, True)
    return down


def test_silu_mul_then_down_keeps_the_down_output_for_its_activation_buffer(monkeypatch) -> None:
    """Switch exl3-mlp-act-input, on the CPU with a reference in place of the kernel: the activation is
    written into ExLlamaV3's buffer, the down linear's call with that buffer gets the kept output (once, and
    only that tensor), and a call the kernel does not take goes to ExLlamaV3's own function."""
    down = fake_down(256, 128, 21)
    seen: list[tuple] = []
    original = lambda g, u, a, limit: seen.append((g, u, a, limit))  # noqa: E731
    wrapper = rows_gemm_patch.SiluMulThenDown(original, down, run=reference_silu_mul)
    g, u = torch.randn(1, 3, 256).half(), torch.randn(1, 3, 256).half()
    a = torch.empty_like(u)
    assert not wrapper.takes(g, u, a, 0.0)  # CPU tensors: the kernel takes CUDA ones only
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))
    assert wrapper.takes(g, u, a, 0.0)
    assert not wrapper.takes(g, u, a, 7.0)  # a clamped activation is not the kernel's
    assert not wrapper.takes(g.float(), u, a, 0.0)
    assert not wrapper.takes(torch.randn(1, 17, 256).half(), torch.randn(1, 17, 256).half(),
                             torch.empty(1, 17, 256).half(), 0.0)  # more rows than the kernel's  # fmt: skip
    before = rows_gemm_patch.calls["silu_mul"]
    wrapper(g, u, a, 0.0)
    assert rows_gemm_patch.calls["silu_mul"] - before == 1 and not seen
    want_act = (g.double() * torch.sigmoid(g.double()) * u.double()).half()
    assert torch.equal(a, want_act), "the activation is written into ExLlamaV3's buffer"
    kept = getattr(down, rows_gemm_patch.ACT_KEPT)
    assert kept.x is a and kept.y.shape == (1, 3, 128)
    assert torch.equal(kept.y, alone(down, want_act, torch.half))
    monkeypatch.setattr(rows_gemm_patch, "_originals", {"forward": lambda *args: "stock"})
    monkeypatch.setattr(rows_gemm_patch, "run", lambda *args: "computed")  # the kernel's own call
    monkeypatch.setattr(rows_gemm_patch, "eligible", lambda *args: True)
    # the down linear's call with another tensor (equal values) drops the kept output and computes afresh
    assert rows_gemm_patch._forward(down, a.clone(), {}) == "computed"
    assert getattr(down, rows_gemm_patch.ACT_KEPT) is None
    wrapper(g, u, a, 0.0)
    assert torch.equal(rows_gemm_patch._forward(down, a, {}), kept.y)  # its own buffer: the kept output, once
    assert rows_gemm_patch._forward(down, a, {}) == "computed"
    wrapper(g, u, a, 0.0)  # a call the kernel does not take: ExLlamaV3's forward, over the written activation
    monkeypatch.setattr(rows_gemm_patch, "eligible", lambda *args: False)
    assert rows_gemm_patch._forward(down, a, {}) == "stock"
    assert getattr(down, rows_gemm_patch.ACT_KEPT) is None
    wrapper(g, u, a, 7.0)  # not taken: ExLlamaV3's function, nothing kept
    assert seen == [(g, u, a, 7.0)] and getattr(down, rows_gemm_patch.ACT_KEPT) is None


def reference_norm_input(x, weight, eps, bias, scale, suhs, residual=None):
    """The norm entry by reference on the CPU (float64 arithmetic rounded to fp16, not ExLlamaV3's fast-math
    bits: these tests check the plumbing), with y itself standing for the fragments (reference_frags reads
    it back)."""
    if residual is not None:
        residual += x.float()
    t = (x.float() if residual is None else residual).double()
    rmf = torch.rsqrt(t.pow(2).mean(dim=-1, keepdim=True) + eps) * scale
    y = (t * rmf * (weight.double() + bias)).half()
    return y, y.clone().view(-1)


def reference_frags(frags, m, k, members):
    return reference_run(frags.view(m, k), members)


def test_a_norm_writes_its_groups_fragments_and_the_group_uses_them(monkeypatch) -> None:
    """Switch exl3-norm-input, on the CPU with references in place of the kernels: the norm's output is
    ExLlamaV3's (residual_in form: the residual written back), the group reading that output runs its GEMM
    over the fragments the norm wrote (once, for that output only), and a call the kernel does not take goes
    to ExLlamaV3's own forward."""
    k = 5120
    layers = [layer(k, 128, 41), layer(k, 128, 42)]
    for lay in layers:
        lay.out_features, lay.K = 128, 4
    runs: list[str] = []
    group = rows_gemm_patch.Group(
        layers,
        run=lambda x, ms: runs.append("input") or reference_run(x, ms),
        run_frags=lambda f, m, kk, ms: runs.append("frags") or reference_frags(f, m, kk, ms),
    )
    norm = SimpleNamespace(
        weight=(0.1 * torch.randn(k)).half(), rms_norm_eps=1e-6, constant_bias=1.0, constant_scale=1.0,
        span_heads=False, groups=1, out_dtype=torch.half, key="model.layers.0.post_attention_layernorm",
    )  # fmt: skip
    stock = lambda *args: "stock"  # noqa: E731
    wrapper = rows_gemm_patch.NormThenGroup(norm, stock, group, run=reference_norm_input)
    x, residual = torch.randn(1, 3, k).half(), torch.randn(1, 3, k)
    assert not wrapper.takes(x, {}, None, None, residual)  # CPU tensors: the kernel takes CUDA ones only
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))
    before = residual.clone()
    y = wrapper(x, {}, None, None, residual)
    assert torch.equal(residual, before + x.float()), "the residual is written back as residual + x"
    want = reference_norm_input(x, norm.weight, 1e-6, 1.0, 1.0, [], before.clone())[0]
    assert y.shape == x.shape and torch.equal(y, want)
    assert group.ready is not None and rows_gemm_patch.calls["norm_input"] > 0
    outs = [group.output(m, y, None) for m in layers]
    assert runs == ["frags"] and group.ready is None
    for m, out in zip(layers, outs, strict=True):
        assert torch.equal(out, alone(m, y, torch.half))
    wrapper(x, {}, None, None, residual)
    group.output(layers[0], y.clone(), None)  # another tensor: the fragments are not its
    assert runs == ["frags", "input"] and group.ready is None
    # calls the kernel does not take: ExLlamaV3's forward
    assert wrapper(x, {}, None, torch.empty_like(x), None) == "stock"  # the post-norm residual form
    assert wrapper(x, {}, torch.float, None, residual) == "stock"
    assert wrapper(x, {"export_state_norm_keys": (norm.key,)}, None, None, residual) == "stock"
    # fp32 with a residual, the form of a Qwen3.5 block (its sublayers' outputs are fp32): taken
    before = residual.clone()
    y32 = wrapper(x.float(), {}, None, None, residual)
    assert torch.equal(residual, before + x.float()) and group.ready is not None
    want = reference_norm_input(x.float(), norm.weight, 1e-6, 1.0, 1.0, [], before.clone())[0]
    assert torch.equal(y32, want)
    group.ready = None
    many = torch.randn(1, 17, k).half()
    assert wrapper(many, {}, None, None, torch.randn(1, 17, k)) == "stock"
    assert (
        wrapper(x.float(), {}, None, None, None) is not None and group.ready is not None
    )  # fp32, no residual


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
        # a group computes each member in the dtype of that member's last call (the model's calls keep theirs:
        # GDN asks qkv in fp16 and z in its fp32 default), so one round with this test's dtypes comes first
        for m in group.members:
            m.forward(x.clone(), {})
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


def _count(module_type: str):
    """How many modules of `module_type` a model has (what a mark should reach)."""
    from elpis.exl3 import walk_modules

    return lambda model: sum(type(m).__name__ == module_type for m in walk_modules(model))


def _norms_with_groups(model) -> int:
    from elpis.exl3 import walk_modules

    return sum(
        type(getattr(block, name, None)).__name__ == "RMSNorm"
        and rows_gemm_patch._reader_group(block, name) is not None
        for block in walk_modules(model)
        for name in rows_gemm_patch.NORM_READERS
    )


def _verify_with_and_without(patched, seed: int, expected, mark, unmark, counter: str) -> None:
    """An eager tree verify's logits with and without a switch's wrappers (given by `mark` to the modules of
    the target it reaches, `expected(model)` of them, taken back by `unmark`): bit for bit equal, and every
    marked module took its path once (`calls[counter]`)."""
    from tests.exl3.test_gpu import prompt

    model = patched.engine.model
    ids = prompt(700, seed, patched.info.vocab_size)
    tokens, parents = [ids[-1], 5, 6, 7, 8, 9], [-1, 0, 0, 1, 1, 3]
    patched.begin(ids)
    try:
        plain = patched.verify(tokens, parents).clone()
        patched.abandon()
        marked = mark(model)
        assert marked == expected(model) > 0
        before = rows_gemm_patch.calls[counter]
        try:
            fused = patched.verify(tokens, parents).clone()
        finally:
            unmark(model)
        assert rows_gemm_patch.calls[counter] - before == marked
        assert torch.equal(plain, fused)
    finally:
        patched.finish()


def _unmark_gdn_qkv(model) -> None:
    from elpis.exl3 import walk_modules

    for m in walk_modules(model):
        if hasattr(m, rows_gemm_patch.QKV_MARK):
            delattr(m, rows_gemm_patch.QKV_MARK)


@pytest.mark.gpu
def test_the_channel_major_qkv_changes_no_bit(patched) -> None:
    """Switch exl3-gdn-qkv-channel-major: an eager tree verify with every Gated DeltaNet layer's qkv written
    bf16 channel-major by the kernel gives the same logits, bit for bit, as without it, and the layers really
    took that output."""
    _verify_with_and_without(
        patched, 13, _count("GatedDeltaNet"), rows_gemm_patch.mark_gdn_qkv, _unmark_gdn_qkv, "channel_major"
    )


@pytest.mark.gpu
def test_the_silu_mul_input_changes_no_bit(patched) -> None:
    """Switch exl3-mlp-act-input: an eager tree verify with every MLP's activation computed in its down
    projection's input launch gives the same logits, bit for bit, as without it, and the MLPs took it."""
    _verify_with_and_without(
        patched,
        17,
        _count("GatedMLP"),
        rows_gemm_patch.mark_mlp_act,
        rows_gemm_patch.unmark_mlp_act,
        "silu_mul",
    )


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """A backend on a synthetic target of the full model's width (hidden 5120: the rows the norm entry takes,
    4096 < k <= 8192; the small model's 1024 are normed in ExLlamaV3's one-pass form, which it leaves alone):
    the small model's layout otherwise, four layers (one full attention), no draft; eager tree verifies."""
    from elpis.exl3 import geometry, load_backend, synth

    config = geometry.small_target_config()
    n = 4
    config.update(
        hidden_size=geometry.load_facts("text_config.json")["hidden_size"],
        num_hidden_layers=n,
        layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n)],
    )
    out = tmp_path_factory.mktemp("wide") / "target"
    synth.write_target(out, config, seed=7)
    rows_gemm_patch.install()
    backend = load_backend(
        out, None, max_context=65536, model_id="wide", host_cache_gib=0.0, tree=True, tree_graphs=False,
        rows_gemm=True,
    )  # fmt: skip
    yield backend


@pytest.mark.gpu
def test_the_norm_input_changes_no_bit(wide) -> None:
    """Switch exl3-norm-input: an eager tree verify with every transformer block's norms writing their
    groups' fragments gives the same logits, bit for bit, as without it, and the groups took them (at the
    full model's width, where the entry takes a norm: fp32 sublayer outputs added into the residual)."""
    _verify_with_and_without(
        wide,
        19,
        _norms_with_groups,
        rows_gemm_patch.mark_norm_input,
        rows_gemm_patch.unmark_norm_input,
        "norm_input",
    )
