"""The parts of the exl3 backend that need no GPU: row-shape checks, block-table width, patch registry."""

from __future__ import annotations

import json

import pytest

from elpis.exl3 import patches
from elpis.exl3.backend import check_chain, stock_table_width


def test_chain_parents_accepted():
    for rows in range(1, 17):
        check_chain(list(range(-1, rows - 1)), rows)


@pytest.mark.parametrize("parents", [[-1, 0, 0], [-1, 0, 1, 1], [-1, 0, 0, 2]])
def test_trees_refused_until_tree_verify(parents):
    with pytest.raises(ValueError, match="chains only"):
        check_chain(parents, len(parents))


@pytest.mark.parametrize(
    ("parents", "rows", "message"),
    [
        ([0, 0], 2, "not a tree"),
        ([-1, 1], 2, "not a tree"),
        ([-1], 2, "parents"),
        ([], 0, "1..16"),
        (list(range(-1, 16)), 17, "1..16"),
    ],
)
def test_bad_parents(parents, rows, message):
    with pytest.raises(ValueError, match=message):
        check_chain(parents, rows)


def test_table_width_rounds_like_stock():
    assert stock_table_width(1) == 16
    assert stock_table_width(16 * 256) == 16
    assert stock_table_width(16 * 256 + 1) == 32
    assert stock_table_width(262144 + 15) == 1040


def test_registry_loads_and_documents_every_patch():
    loaded = patches.load_registry()
    assert loaded, "the registry lists the run-time patches"
    readme = (patches.REGISTRY.parent / "README.md").read_text()
    for p in loaded:
        assert p.switch.startswith("ELPIS_PATCH_") and p.evidence and p.purpose
        assert p.id in readme, f"{p.id} missing from patches/README.md"


def test_patch_switch_values(monkeypatch):
    p = patches.load_registry()[0]
    monkeypatch.setenv(p.switch, "1")
    assert p.enabled()
    monkeypatch.setenv(p.switch, "0")
    assert not p.enabled()
    monkeypatch.setenv(p.switch, "yes")
    with pytest.raises(ValueError, match="'0' or '1'"):
        p.enabled()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"switch": "EXL3_FOO"}, "ELPIS_PATCH_"),
        ({"kind": "fork"}, "kind"),
        ({"env": {}}, "sets no variables"),
    ],
)
def test_bad_registry_entries(tmp_path, change, message):
    data = json.loads(patches.REGISTRY.read_text())
    entry = {**data["patches"][0], **change}
    path = tmp_path / "registry.json"
    path.write_text(json.dumps({"patches": [entry]}))
    with pytest.raises(ValueError, match=message):
        patches.load_registry(path)


@pytest.mark.parametrize("chunk", [0, 1000, 2047, 3072, 16384])
def test_prefill_chunk_refused_before_anything_loads(chunk):
    from elpis.exl3 import load_backend

    with pytest.raises(ValueError, match=r"prefill chunk must be one of \(2048, 4096, 8192\) tokens"):
        load_backend("no/such/model", None, prefill_chunk=chunk)


def test_prefill_chunks_keep_page_boundaries_and_default_to_exllamav3s():
    import inspect

    from elpis.exl3 import DEFAULT_PREFILL_CHUNK, EXLLAMA_PREFILL_CHUNK, PREFILL_CHUNKS, load_backend
    from elpis.exl3.engine import load_engine
    from elpis.exl3.prefix import PAGE

    assert DEFAULT_PREFILL_CHUNK == EXLLAMA_PREFILL_CHUNK == 2048 and DEFAULT_PREFILL_CHUNK in PREFILL_CHUNKS
    assert all(chunk % PAGE == 0 for chunk in PREFILL_CHUNKS)  # prefix-cache boundaries stay page-aligned
    for loader in (load_backend, load_engine):
        assert inspect.signature(loader).parameters["prefill_chunk"].default == DEFAULT_PREFILL_CHUNK


def test_rows_gemm_defaults_to_the_registry_switch_in_tree_mode_only(monkeypatch):
    from elpis.exl3 import default_rows_gemm
    from elpis.exl3.rows_gemm_patch import PATCH

    registry = {p.id: p for p in patches.load_registry()}
    switch = registry[PATCH].switch
    monkeypatch.delenv(switch, raising=False)
    assert registry[PATCH].default is True  # on by default (bench/results/rows_gemm/README.md, session 12)
    assert default_rows_gemm(tree=True) is True
    assert default_rows_gemm(tree=False) is False  # chain verifies run in ExLlamaV3's block graphs
    monkeypatch.setenv(switch, "0")
    assert default_rows_gemm(tree=True) is False


def test_gdn_ba_is_on_by_default_and_follows_its_switch_in_tree_mode_only(monkeypatch):
    from elpis.exl3 import default_gdn_ba
    from elpis.exl3.gdn_ba_patch import PATCH

    registry = {p.id: p for p in patches.load_registry()}
    switch = registry[PATCH].switch
    monkeypatch.delenv(switch, raising=False)
    assert registry[PATCH].default is True  # on by default (bench/results/tree/README.md, session 14)
    assert default_gdn_ba(tree=True) is True
    assert default_gdn_ba(tree=False) is False  # it acts inside tree verifies only
    monkeypatch.setenv(switch, "0")
    assert default_gdn_ba(tree=True) is False


def test_the_vocab_draws_family_is_on_by_default_and_each_switch_turns_its_part_off(monkeypatch):
    """Sampled requests without top_k run on the GPU by default, flat rows included (the nucleus, on since
    session 60: bench/results/server/README.md); each part's switch still turns it off alone."""
    from elpis.exl3 import vocab_draw

    registry = {p.id: p for p in patches.load_registry()}
    family = (vocab_draw.PATCH, vocab_draw.HEADS_PATCH, vocab_draw.NUCLEUS_PATCH)
    for patch in family:
        monkeypatch.delenv(registry[patch].switch, raising=False)
        assert registry[patch].default is True and patches.enabled(patch), patch
    monkeypatch.setenv(registry[vocab_draw.NUCLEUS_PATCH].switch, "0")
    assert not patches.enabled(vocab_draw.NUCLEUS_PATCH)
    assert patches.enabled(vocab_draw.PATCH) and patches.enabled(vocab_draw.HEADS_PATCH)


def test_prefill_groups_are_on_by_default_with_exllamas_chunks_only(monkeypatch):
    from elpis.exl3 import DEFAULT_PREFILL_GROUP, default_prefill_group
    from elpis.exl3.prefill_groups import PATCH

    registry = {p.id: p for p in patches.load_registry()}
    switch = registry[PATCH].switch
    monkeypatch.delenv(switch, raising=False)
    assert registry[PATCH].default is True  # on by default (bench/results/prefill/README.md, session 15)
    assert default_prefill_group(2048) == DEFAULT_PREFILL_GROUP
    assert default_prefill_group(8192) == 1  # shown exact for 2048-token chunks only
    monkeypatch.setenv(switch, "0")
    assert default_prefill_group(2048) == 1


def test_the_verify_gate_is_off_by_default_and_needs_tree_graphs(monkeypatch):
    from elpis.exl3 import default_prelaunch, load_backend
    from elpis.exl3.verify_gate import PATCH

    registry = {p.id: p for p in patches.load_registry()}
    assert registry[PATCH].kind == "switch"  # read by load_backend; nothing of ExLlamaV3 is wrapped
    switch = registry[PATCH].switch
    monkeypatch.delenv(switch, raising=False)
    assert default_prelaunch(True) is registry[PATCH].default
    monkeypatch.setenv(switch, "1")
    assert default_prelaunch(True) is True
    assert default_prelaunch(False) is False  # it queues replays of captured tree verifies only
    monkeypatch.setenv(switch, "0")
    assert default_prelaunch(True) is False
    for tree, graphs in ((False, True), (True, False)):
        with pytest.raises(ValueError, match="prelaunch queues replays of tree verifies"):
            load_backend("no/such/model", None, tree=tree, tree_graphs=graphs, prelaunch=True)


def test_a_switch_patch_installs_nothing(tmp_path, monkeypatch):
    data = json.loads(patches.REGISTRY.read_text())
    entry = {**data["patches"][0], "id": "x-switch", "kind": "switch", "switch": "ELPIS_PATCH_X_SWITCH"}
    entry.pop("env", None)
    path = tmp_path / "registry.json"
    path.write_text(json.dumps({"patches": [entry]}))
    (loaded,) = patches.load_registry(path)
    assert loaded.kind == "switch" and loaded.module is None
    monkeypatch.setattr(patches, "_applied", {})
    monkeypatch.setenv("ELPIS_PATCH_X_SWITCH", "1")
    assert patches.apply_all(path) == {"x-switch": True}  # recorded as on; no module to call


def test_host_threads_are_checked_before_loading():
    from elpis.exl3 import check_host_threads, load_backend

    check_host_threads(None)
    check_host_threads(1)
    for bad in (0, -2, 4096):
        with pytest.raises(ValueError, match="host_threads"):
            load_backend("/nonexistent", None, host_threads=bad)  # refused before any CUDA check or load


def test_the_prefill_runs_with_torchs_threads_and_rounds_with_host_threads():
    import torch

    from elpis.exl3.backend import Exl3Backend

    loaded = torch.get_num_threads()
    backend = Exl3Backend.__new__(Exl3Backend)  # the thread switch alone; no engine needed
    backend.host_threads, backend.prefill_threads = 1, 2
    torch.set_num_threads(1)
    try:
        with backend._prefill_threads():
            assert torch.get_num_threads() == 2
        assert torch.get_num_threads() == 1
        with pytest.raises(KeyError), backend._prefill_threads():
            raise KeyError("a failed prefill")
        assert torch.get_num_threads() == 1
        backend.host_threads = None  # torch's setting left alone
        with backend._prefill_threads():
            assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(loaded)


class _Done:
    """A CUDA event whose work has finished (the snapshot worker only polls it)."""

    def query(self) -> bool:
        return True


def test_the_snapshot_worker_fills_tensors_made_in_inference_mode_or_not():
    from concurrent.futures import ThreadPoolExecutor

    import torch

    from elpis.exl3.backend import _drain

    staged = [("a.recurrent", torch.arange(6.0).view(2, 3)), ("a.conv", torch.ones(4, dtype=torch.bfloat16))]
    with ThreadPoolExecutor(max_workers=1) as worker:
        for inference in (True, False):
            with torch.inference_mode(inference):  # the backend's begin() runs under inference mode
                out = {name: torch.empty(t.shape, dtype=t.dtype) for name, t in staged}
            worker.submit(_drain, _Done(), staged, out).result()  # another thread: not in inference mode
            assert all(torch.equal(out[name], t) for name, t in staged)


# --- tree mode's wrappers, installed and suspended (stand-in owners: exllamav3 is not on the CPU machine) ---


class _Owner:
    """Holds one callable attribute, as ExLlamaV3's modules and classes hold the five wrapped names."""

    def __init__(self, name: str) -> None:
        self.name = name
        setattr(self, name, lambda *a, **k: ("original", name))


@pytest.fixture
def wrap_targets(monkeypatch):
    from elpis.exl3 import tree_verify

    owners = [_Owner(f"f{i}") for i in range(5)]
    targets = [(o.name, o, o.name, lambda *a, _n=o.name, **k: ("wrapper", _n)) for o in owners]
    monkeypatch.setattr(tree_verify, "_wrap_targets", lambda: targets)
    monkeypatch.setattr(tree_verify, "_originals", {})
    monkeypatch.setattr(tree_verify, "require_tree_patch", lambda: None)
    return tree_verify, owners


def test_suspended_restores_exllamav3s_names_then_the_wrappers(wrap_targets):
    tree_verify, owners = wrap_targets
    originals = [getattr(o, o.name) for o in owners]
    with tree_verify.suspended():  # nothing installed yet: nothing to swap
        assert [getattr(o, o.name) for o in owners] == originals
    tree_verify.install()
    assert [getattr(o, o.name)()[0] for o in owners] == ["wrapper"] * 5
    with tree_verify.suspended():
        assert [getattr(o, o.name) for o in owners] == originals
    assert [getattr(o, o.name)()[0] for o in owners] == ["wrapper"] * 5
    with pytest.raises(KeyError), tree_verify.suspended():
        raise KeyError("the block failed")
    assert [getattr(o, o.name)()[0] for o in owners] == ["wrapper"] * 5  # put back after an exception too


def test_suspended_refuses_while_a_tree_verify_runs(wrap_targets, monkeypatch):
    tree_verify, owners = wrap_targets
    tree_verify.install()
    monkeypatch.setattr(tree_verify, "_active", object())
    with pytest.raises(RuntimeError, match="a tree verify is running"), tree_verify.suspended():
        pass
    assert [getattr(o, o.name)()[0] for o in owners] == ["wrapper"] * 5


def test_no_tree_verify_while_suspended(wrap_targets):
    """A tree verify inside the block would run ExLlamaV3's own kernels: refused, and so is a nested block."""
    tree_verify, owners = wrap_targets
    tree_verify.install()
    with tree_verify.suspended():
        with pytest.raises(RuntimeError, match="suspended"), tree_verify.tree_forward(object()):
            pass
        with pytest.raises(RuntimeError, match="already suspended"), tree_verify.suspended():
            pass
        assert tree_verify._active is None
    with tree_verify.tree_forward(object()):  # allowed again once the block has ended
        assert [getattr(o, o.name)()[0] for o in owners] == ["wrapper"] * 5


def test_device_rounds_are_on_by_default_where_they_apply_and_refused_without_what_they_need(monkeypatch):
    """On by default since session 41 (faster than host rounds beyond noise, the whole GPU suite passing with
    them and the embedding gather on: bench/results/tree/README.md), with the gather they need; the default
    applies only where they can run, asking for them elsewhere is refused, and switched off they are refused
    too."""
    from elpis.exl3 import check_device_rounds, default_device_rounds, default_embed_gather
    from elpis.exl3.device_round import PATCH
    from elpis.exl3.embed_gather import PATCH as GATHER

    registry = {p.id: p for p in patches.load_registry()}
    switch = registry[PATCH].switch
    monkeypatch.delenv(switch, raising=False)
    monkeypatch.delenv(registry[GATHER].switch, raising=False)
    assert registry[PATCH].default is True and registry[GATHER].default is True
    assert default_device_rounds() is True and default_embed_gather(True) is True
    assert default_device_rounds(False) is False  # on, but not where they do not apply
    monkeypatch.setenv(switch, "0")
    assert default_device_rounds() is False
    with pytest.raises(ValueError, match=f"the registry switch {PATCH}"):
        check_device_rounds(True, True, True, False)
    monkeypatch.setenv(switch, "1")
    check_device_rounds(True, True, True, False)  # everything it needs
    for args, missing in (
        ((False, True, True, False), "tree mode with tree graphs"),
        ((True, False, True, False), "a DFlash2 draft with draft graphs"),
        ((True, True, False, False), "the embedding gather"),
        ((True, True, True, True), "no verify gate"),
    ):
        with pytest.raises(ValueError, match=missing):
            check_device_rounds(*args)


def test_the_run_choice_is_on_by_default_where_it_applies_and_refused_elsewhere(monkeypatch):
    """On since session 50 (bench/results/tree/README.md): where rounds run on the GPU with graphs captured
    at load and trees of more than 8 rows; asked for elsewhere, or switched off, it is refused with the
    reason."""
    from elpis.exl3 import RUN_CHOICE_PATCH, check_run_choice, default_run_choice

    registry = {p.id: p for p in patches.load_registry()}
    switch = registry[RUN_CHOICE_PATCH].switch
    monkeypatch.delenv(switch, raising=False)
    assert registry[RUN_CHOICE_PATCH].default is True
    assert default_run_choice(True) is True and default_run_choice(False) is False
    check_run_choice(True)
    with pytest.raises(ValueError, match="rounds on the GPU, graphs captured at load"):
        check_run_choice(False)
    monkeypatch.setenv(switch, "0")
    assert default_run_choice(True) is False
    with pytest.raises(ValueError, match=f"the registry patch {RUN_CHOICE_PATCH} is switched off"):
        check_run_choice(True)


def tree_backend(fixed_rows: int, runs: tuple[int, ...] | None, round_seconds=None):
    """An Exl3Backend with only what its row-count methods read (no engine: they need none)."""
    import types

    from elpis.exl3.backend import Exl3Backend

    backend = Exl3Backend.__new__(Exl3Backend)
    backend.fixed_rows, backend.runs, backend.tree = fixed_rows, runs, True
    backend.engine = types.SimpleNamespace(cache_tokens=270_336)
    backend.warmup = None if round_seconds is None else types.SimpleNamespace(round_seconds=round_seconds)
    return backend


def test_a_tree_verify_runs_at_the_smallest_row_count_that_holds_it():
    both = tree_backend(16, (8, 16))
    assert both.tree_runs() == (8, 16)
    assert [both.verify_run(rows) for rows in (1, 8, 9, 16)] == [8, 8, 16, 16]
    one = tree_backend(16, None)
    assert one.tree_runs() == (16,) and one.verify_run(3) == 16
    eight = tree_backend(8, (8, 16))  # the bench's tree-8 system on a load with both counts
    assert eight.tree_runs() == (8,)
    with pytest.raises(ValueError, match="over the backend's 8-row verifies"):
        eight.verify_run(9)
    with pytest.raises(ValueError, match="leave out the backend's own"):
        tree_backend(16, (8,)).tree_runs()


def test_a_rounds_cost_is_its_context_buckets_time_at_load():
    from elpis.backend import BackendError

    seconds = {(8, 4096): 0.014, (16, 4096): 0.0155, (8, 8192): 0.0144, (16, 8192): 0.0159}
    backend = tree_backend(16, (8, 16), seconds)
    assert backend.round_cost(8, 1000) == 0.014 and backend.round_cost(16, 4080) == 0.0155
    assert backend.round_cost(16, 4081) == 0.0159  # its 16 rows reach past 4,096
    with pytest.raises(BackendError, match="no round of 8 rows was timed"):
        backend.round_cost(8, 9000)
    with pytest.raises(BackendError, match="timed when the graphs are captured at load"):
        tree_backend(16, (8, 16)).round_cost(8, 0)


def test_a_verify_takes_only_the_pages_of_its_own_positions():
    from elpis.exl3.tree_graph import verify_pages

    pages = list(range(3, 3 + 17))  # a 16-row round from 4,081 allocated the 17th page
    assert verify_pages(pages, 4081, 16) == pages
    assert verify_pages(pages, 4088, 8) == pages[:16]
    assert verify_pages(pages, 4089, 8) == pages
