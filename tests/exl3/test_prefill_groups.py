"""Layer-major prefill groups (patch exl3-prefill-groups, `elpis.exl3.prefill_groups`).

CPU: how a prefill's chunks are grouped (the prefix cache's own boundaries and snapshot rule). GPU (the small
synthetic checkpoint): a grouped prefill leaves the target's and the draft's K/V pages, the recurrent state
and the next verify's logits bitwise equal to a chunk-by-chunk prefill of the same prompt, while it rebuilds
fewer weights; and the backend refuses groups it cannot run exactly.
"""

from __future__ import annotations

import pytest

from elpis.exl3 import DEFAULT_PREFILL_GROUP
from elpis.exl3.prefill_groups import plan_groups
from elpis.exl3.prefix import prefill_boundaries


def test_groups_hold_at_most_size_chunks_in_order():
    stops = prefill_boundaries(0, 10_939, 2048)
    assert stops == [2048, 4096, 6144, 8192, 10240, 10752, 10939]
    groups = plan_groups(stops, lambda stop: False, 4)
    assert groups == [[2048, 4096, 6144, 8192], [10240, 10752, 10939]]
    assert plan_groups(stops, lambda stop: False, DEFAULT_PREFILL_GROUP) == [stops]
    assert plan_groups(stops, lambda stop: False, 1) == [[s] for s in stops]


def test_groups_end_only_at_snapshots_off_a_page_boundary():
    """The prefix cache snapshots at multiples of its interval, at the last whole chunk and at the end. A
    snapshot on a page boundary is taken inside a group, layer by layer; the end, off a page boundary, reads
    the partial page the whole model writes, so its group ends there."""
    end = 30_000
    stops = prefill_boundaries(6144, end, 2048)  # a resumed prefill starts at a chunk boundary

    def snapshot(stop: int) -> bool:  # PrefixCache.wants_snapshot with its defaults (interval 8192)
        return stop == end or stop % 8192 == 0 or stop == end // 2048 * 2048

    groups = plan_groups(stops, snapshot, 8)
    assert [s for g in groups for s in g] == stops
    assert groups == [stops[:8], stops[8:]]
    assert plan_groups(stops, snapshot, DEFAULT_PREFILL_GROUP) == [stops]
    assert groups[-1][-1] == end and stops[-2] == 29_952  # the last page boundary before the end
    # an end off a page boundary before the group is full
    short = prefill_boundaries(0, 5000, 2048)
    assert plan_groups(short, lambda stop: stop == 5000, DEFAULT_PREFILL_GROUP) == [[2048, 4096, 4864, 5000]]
    assert plan_groups([1000, 2048], lambda stop: stop == 1000, DEFAULT_PREFILL_GROUP) == [[1000], [2048]]
    assert plan_groups([1024, 2048], lambda stop: stop == 1024, DEFAULT_PREFILL_GROUP) == [[1024, 2048]]


def test_bad_plans_are_refused():
    with pytest.raises(ValueError, match="at least one chunk"):
        plan_groups([2048], lambda s: False, 0)
    with pytest.raises(ValueError, match="ascend"):
        plan_groups([4096, 2048], lambda s: False, 4)


# -- GPU --------------------------------------------------------------------------------------------------


def _prefill_record(backend, ids: list[int]) -> dict:
    """Everything a prefill leaves behind: the K/V (target and draft) of the positions it wrote, the recurrent
    state, the prefix cache's snapshots (position, state, tail page), the next verify's logits. (Slots past
    the prompt's end are not compared: a page the sequence got back from an earlier one still holds that
    one's rows there, never read.)"""
    import torch

    prefix = backend.prefix
    prefix.snapshots.clear()  # every prefill here is cold: nothing to resume from
    prefix.snapshot_used = 0
    backend.begin(ids)
    store = prefix.store
    pages = torch.tensor(backend.pages, dtype=torch.long, device=store.parts[0].device)
    written = len(ids) - 1  # the prompt but its last token, which the first verify feeds
    record = {
        "kv": [t.index_select(0, pages).flatten(0, 1)[:written].cpu() for t in store.parts],
        "state": store.save_state(),
        "snapshots": [(snap.position, snap.state, snap.tail) for snap in backend.snaps],
    }
    tokens = [ids[-1], 11, 12, 13]
    record["logits"] = backend.verify(tokens, [-1, 0, 1, 2]).cpu()
    backend.finish()
    torch.cuda.synchronize()
    store.settle()
    return record


def _same_states(a: dict, b: dict) -> bool:
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.gpu
@pytest.mark.parametrize("group", [4, 8])
def test_grouped_prefill_is_bitwise_chunk_by_chunk(small, group):
    """10,940 tokens: chunks of 2048 to 10,240, then 512 + 187 on ExLlamaV3's own path (below the
    fused-rebuild row count). Snapshots at 8192 and 10,240 (page boundaries) and at the end 10,939. Groups
    of four: [2048..8192], [10240, 10752, 10939]; of eight: one group. A page-boundary snapshot that is not
    its group's last stop (10,240 in groups of four; 8192 and 10,240 in a group of eight) is taken inside the
    group, layer by layer."""
    import torch

    from elpis.exl3 import load_backend, prefill_groups
    from elpis.exl3.prefill_groups import counts

    b = load_backend(
        small / "target",
        small / "draft",
        max_context=65536,
        model_id="small",
        host_cache_gib=0.0,
        prefix_cache=True,
        tree=True,
        tree_graphs=False,
        prefill_group=group,
    )
    vocab = b.info.vocab_size
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, vocab, (10_940,), generator=gen).tolist()
    b.prefill_group = 1
    plain = _prefill_record(b, ids)
    b.prefill_group = group
    before = dict(counts)
    grouped = _prefill_record(b, ids)
    rebuilt, reused = counts["rebuilt"] - before["rebuilt"], counts["reused"] - before["reused"]
    linears = sum(1 for m in _exl3_linears(b.engine.model))
    print(f"prefill groups of {group}: {rebuilt} rebuilt, {reused} reused, {linears} EXL3 linears")
    # per linear reached: five 2048-row chunks; groups of four rebuild twice and reuse three times, a group of
    # eight rebuilds once and reuses four times
    expected = {4: (2, 3), 8: (1, 4)}[group]
    reached = rebuilt // expected[0]
    assert reached > 0, (rebuilt, reused)
    assert (rebuilt, reused) == (expected[0] * reached, expected[1] * reached), (rebuilt, reused)
    assert len(plain["kv"]) == len(grouped["kv"]) > 0
    for i, (p, g) in enumerate(zip(plain["kv"], grouped["kv"], strict=True)):
        assert p.shape[0] == len(ids) - 1 and torch.equal(p, g), f"cache tensor {i} differs"
    assert _same_states(plain["state"], grouped["state"])
    assert [s[0] for s in plain["snapshots"]] == [s[0] for s in grouped["snapshots"]] == [8192, 10240, 10939]
    for (position, p_state, p_tail), (_, g_state, g_tail) in zip(
        plain["snapshots"], grouped["snapshots"], strict=True
    ):
        assert _same_states(p_state, g_state), f"snapshot at {position} differs"
        assert (p_tail is None) == (g_tail is None) == (position % 256 == 0)
        assert p_tail is None or torch.equal(p_tail, g_tail)
    # the snapshots are of different positions: a state copied at the wrong time would equal its neighbour's
    states = [s[1] for s in grouped["snapshots"]]
    assert not _same_states(states[0], states[1]) and not _same_states(states[1], states[2])
    assert torch.equal(plain["logits"], grouped["logits"])
    assert prefill_groups.installed()


def test_groups_are_refused_where_they_would_not_be_exact():
    from elpis.exl3 import check_prefill_group

    assert check_prefill_group(1, 8192) == 1
    assert check_prefill_group(DEFAULT_PREFILL_GROUP, 2048) == DEFAULT_PREFILL_GROUP
    with pytest.raises(ValueError, match="2048-token chunks"):
        check_prefill_group(DEFAULT_PREFILL_GROUP, 8192)
    with pytest.raises(ValueError, match="at least 1"):
        check_prefill_group(0, 2048)

    from elpis.exl3 import load_backend

    # load_backend refuses them before it looks for a GPU or a model
    with pytest.raises(ValueError, match="2048-token chunks"):
        load_backend("/nonexistent", None, prefill_chunk=8192, prefill_group=DEFAULT_PREFILL_GROUP)
    with pytest.raises(ValueError, match="at least 1"):
        load_backend("/nonexistent", None, prefill_group=0)


def _exl3_linears(model):
    from elpis.exl3 import walk_modules

    for module in walk_modules(model):
        inner = getattr(module, "inner", None)
        if type(inner).__name__ == "LinearEXL3":
            yield inner


def _named(name: str, **attrs):
    return type(name, (), attrs)()


def test_only_the_qwen35_family_is_grouped():
    """A module kind the layer-major order is not shown exact for (one reading the recurrent position, say)
    is refused with its name; so are tensor-parallel models."""
    from elpis.exl3.prefill_groups import check_model

    def model(*blocks, **attrs):
        fwd = [(_named("Embedding"), 0, 0)] + [(b, 0, i + 1) for i, b in enumerate(blocks)]
        return _named("Model", fwd_modules=fwd, **attrs)

    gdn = _named("TransformerBlock", attn=_named("GatedDeltaNet"), mlp=_named("GatedMLP"))
    full = _named("TransformerBlock", attn=_named("Attention", qsa_indexer=None), mlp=_named("GatedMLP"))
    check_model(model(gdn, full, _named("RMSNorm")))
    conv = _named("TransformerBlock", attn=_named("ShortConv"), mlp=_named("GatedMLP"))
    with pytest.raises(RuntimeError, match="attn: ShortConv"):
        check_model(model(gdn, conv))
    sparse = _named("TransformerBlock", attn=_named("Attention", qsa_indexer=object()), mlp=None)
    with pytest.raises(RuntimeError, match="attn: Attention"):
        check_model(model(sparse))
    with pytest.raises(RuntimeError, match="SharedKVAttention"):
        check_model(model(gdn, _named("SharedKVAttention")))
    with pytest.raises(RuntimeError, match="tensor-parallel"):
        check_model(model(gdn, loaded_tp=True))


def test_a_process_without_the_registry_patch_is_refused(monkeypatch):
    from elpis.exl3 import prefill_groups

    monkeypatch.setattr(prefill_groups, "_original", [])
    monkeypatch.setenv("ELPIS_PATCH_PREFILL_GROUPS", "0")
    with pytest.raises(RuntimeError, match="exl3-prefill-groups, which is switched off"):
        prefill_groups.require_patch()
    with pytest.raises(RuntimeError, match="switched off"), prefill_groups.weight_store():
        pass
    monkeypatch.setenv("ELPIS_PATCH_PREFILL_GROUPS", "1")
    with pytest.raises(RuntimeError, match="not applied"):
        prefill_groups.require_patch()


def _fake_recurrent_util(monkeypatch) -> list:
    """exllamav3's `advance_recurrent_states` (not installed in CPU CI) replaced by a recorder."""
    import sys
    import types

    advanced: list = []
    fake = types.ModuleType("exllamav3.cache.recurrent_util")
    fake.advance_recurrent_states = lambda ids, params, model: advanced.append(ids)
    for name in ("exllamav3", "exllamav3.cache"):
        monkeypatch.setitem(sys.modules, name, sys.modules.get(name) or types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "exllamav3.cache.recurrent_util", fake)
    return advanced


@pytest.mark.parametrize("overlap", [True, False])
def test_the_embedding_runs_chunk_by_chunk_ahead_of_the_first_block(monkeypatch, overlap):
    """With ExLlamaV3's embedding table in host memory, chunk j's rows are gathered just before the first
    block runs chunk j (so the CPU gathers chunk j+1 while the GPU runs chunk j); every other module runs
    layer-major; each module still sees each chunk once, in position order."""
    import torch

    from elpis.exl3 import prefill_groups

    advanced = _fake_recurrent_util(monkeypatch)
    monkeypatch.setattr(prefill_groups, "OVERLAP_EMBEDDING", overlap)
    monkeypatch.setattr(prefill_groups, "_original", [None])  # as if installed: no linear is rebuilt here
    monkeypatch.delenv("ELPIS_PATCH_PREFILL_GROUPS", raising=False)
    log: list = []

    def module(kind: str, name: str, device: str, **attrs):
        def forward(self, x, params):
            log.append((name, params["chunk"]))
            # (rows on the meta device: the CPU staging through pinned memory is the GPU tests' to check)
            return torch.empty(1, device="meta") if kind == "Embedding" else x

        cls = type(kind, (), {"forward": forward, "prepare_for_device": lambda self, x, params: x})
        obj = cls()
        obj.device = device
        for key, value in attrs.items():
            setattr(obj, key, value)
        return obj

    gdn = _named("GatedDeltaNet")
    blocks = [
        module("TransformerBlock", f"block{i}", "cuda:0", attn=gdn, mlp=_named("GatedMLP")) for i in range(2)
    ]
    fwd = [(module("Embedding", "embed", "cpu"), None, 0)] + [(b, None, i + 1) for i, b in enumerate(blocks)]
    model = _named(
        "Model",
        fwd_modules=fwd,
        last_kv_module_idx_instance=(2, None),
        prepare_inputs=lambda self, ids, params: torch.tensor(int(ids)),
    )
    passes = [(j, {"chunk": j}) for j in range(3)]
    seen: list = []
    prefill_groups.prefill_layer_major(model, passes, after_chunk=lambda m, j: seen.append((m.device, j)))
    chunks = range(3)
    if overlap:
        first = [step for j in chunks for step in (("embed", j), ("block0", j))]
    else:
        first = [("embed", j) for j in chunks] + [("block0", j) for j in chunks]
    assert log == first + [("block1", j) for j in chunks]
    assert len(seen) == 9 and advanced == [0, 1, 2]
    assert all("prefill" not in params for _, params in passes)
