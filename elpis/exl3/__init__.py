"""The GPU engine: ExLlamaV3 (EXL3 Qwen3.8-27B + DFlash2 draft) behind `elpis.backend.Backend`.

`load_backend(model_dir, draft_dir, max_context, model_id)` is what `elpis serve --backend exl3` calls; the
returned backend carries its DFlash2 drafter as `backend.drafter` (None without a draft directory). Nothing
here imports exllamav3 until a backend is loaded, so CPU machines can import the package.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

# Prefill chunk sizes (tokens). 2048 is ExLlamaV3's own and keeps its arithmetic. 8192 rebuilds each EXL3
# weight (trellis decode to fp16) once per 8192 tokens, so a cold prefill is up to 1.2x faster (H200,
# bench/results/prefill/README.md); its logits are not bitwise those of 2048-token chunks, and the quality
# gate passed it (rule exl3-small-prefill-r1, bench/results/gate/verdicts/prefill-chunk-8192-*). It stays
# opt-in because the prefix cache resumes only at chunk boundaries (a resumed prefill must run the cold
# prefill's chunks, elpis/exl3/prefix.py): with 8192-token chunks a follow-up turn reuses nothing of a
# prompt shorter than 8192 tokens and recomputes up to 8191 tokens more than with 2048 (device call 23,
# tests/exl3/test_gpu.py::test_prefix_reuse_is_exact). Since session 15, 2048-token chunks run layer-major in
# groups (`prefill_group`, patch exl3-prefill-groups; sixteen chunks since session 18): each weight is rebuilt
# once per group with the arithmetic of 2048-token chunks, which leaves 8192 little to offer (groups of four:
# 8,354 / 8,089 tok/s cold at 8K / 32K against 8,986 / 7,974 for 8192-token chunks, separate runs). Here,
# not in engine.py, so that the CLIs' option parsers read them without importing torch.
EXLLAMA_PREFILL_CHUNK = 2048
# 2048-token chunks per layer-major prefill group by default, and the most `elpis serve` offers: the 24 GiB
# test at 262K passes with it at a 22.53 GiB peak (bench/results/prefill/README.md, session 18)
DEFAULT_PREFILL_GROUP = 16
DEFAULT_PREFILL_CHUNK = EXLLAMA_PREFILL_CHUNK
PREFILL_CHUNKS = (2048, 4096, 8192)


def check_prefill_chunk(chunk: int) -> int:
    if chunk not in PREFILL_CHUNKS:
        raise ValueError(f"prefill chunk must be one of {PREFILL_CHUNKS} tokens, got {chunk}")
    return chunk


if TYPE_CHECKING:
    from elpis.exl3.backend import Exl3Backend

GiB = 1 << 30


def default_rows_gemm(tree: bool) -> bool:
    """Whether a model loads with elpis's GEMM for 1-16 rows when the caller does not say: in tree mode, as
    the registry patch exl3-rows-gemm is switched (on by default: bench/results/rows_gemm/README.md); in
    chain mode never, since a chain verify's GEMMs run inside ExLlamaV3's C++ block graphs, which no wrapper
    reaches, and a model loaded for the kernel is built without ExLlamaV3's multi-projection bundles."""
    from elpis.exl3 import patches
    from elpis.exl3.rows_gemm_patch import PATCH

    return tree and patches.enabled(PATCH)


def default_gdn_ba(tree: bool) -> bool:
    """Whether a model loads with elpis's gate-projection kernel when the caller does not say: in tree mode
    (the only place it acts), as the registry patch exl3-gdn-ba is switched (on by default:
    bench/results/tree/README.md, session 14)."""
    from elpis.exl3 import patches
    from elpis.exl3.gdn_ba_patch import PATCH

    return tree and patches.enabled(PATCH)


def default_prelaunch(tree_graphs: bool) -> bool:
    """Whether replayed tree verifies are queued behind the verify gate while the draft runs
    (`elpis.exl3.verify_gate`) when the caller does not say: with tree graphs, as the registry switch
    exl3-verify-prelaunch says."""
    from elpis.exl3 import patches
    from elpis.exl3.verify_gate import PATCH

    return tree_graphs and patches.enabled(PATCH)


def default_embed_gather(graphs: bool) -> bool:
    """Whether captured tree verifies and draft blocks gather their embedding rows on the GPU from the host
    table mapped for the device (`elpis.exl3.embed_gather`) when the caller does not say: with graphs, as the
    registry switch exl3-embed-gather says."""
    from elpis.exl3 import patches
    from elpis.exl3.embed_gather import PATCH

    return graphs and patches.enabled(PATCH)


def check_prefill_group(group: int, chunk: int) -> int:
    """`group` chunks per layer-major prefill group, checked: more than one only with ExLlamaV3's own
    2048-token chunks (what the patch is shown bit-identical for)."""
    if group < 1:
        raise ValueError(f"prefill_group must be at least 1, got {group}")
    if group > 1 and chunk != EXLLAMA_PREFILL_CHUNK:
        raise ValueError(
            f"prefill groups of {group} chunks need {EXLLAMA_PREFILL_CHUNK}-token chunks, not {chunk}"
        )
    return group


def default_prefill_group(prefill_chunk: int) -> int:
    """Chunks per layer-major prefill group when the caller does not say: with ExLlamaV3's 2048-token chunks,
    as the registry patch exl3-prefill-groups is switched (`elpis.exl3.prefill_groups`: bit-identical, each
    EXL3 weight rebuilt once per group); 1 (chunk by chunk) otherwise."""
    from elpis.exl3 import patches
    from elpis.exl3.prefill_groups import PATCH

    return DEFAULT_PREFILL_GROUP if prefill_chunk == EXLLAMA_PREFILL_CHUNK and patches.enabled(PATCH) else 1


def load_backend(
    model_dir: str | Path,
    draft_dir: str | Path | None,
    max_context: int = 262_144,
    model_id: str = "qwen3.8-27b",
    *,
    host_cache_gib: float = 8.0,
    disk_cache_dir: str | Path | None = None,
    prefix_cache: bool = True,
    fixed_rows: int | None = 8,
    gdn_state_fp32: bool = True,
    warmup: bool = True,
    tree: bool = False,
    tree_rows: int = 16,
    tree_graphs: bool = True,
    draft_graphs: bool = True,
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
    rows_gemm: bool | None = None,
    gdn_ba: bool | None = None,
    prefill_group: int | None = None,
    host_threads: int | None = 1,
    capture_graphs: bool = True,
    prelaunch: bool | None = None,
    embed_gather: bool | None = None,
    device_rounds: bool | None = None,
    run_choice: bool | None = None,
) -> Exl3Backend:
    """Load target + draft onto the first GPU with the 270,336-token 3-bit cache and return the backend.

    `host_cache_gib`: host-RAM tier for evicted prefix pages (0 disables it). `disk_cache_dir`: persist
    prefix pages and snapshots there, in a subdirectory bound to the model files and cache geometry.
    `fixed_rows`: every verify runs this many rows (None: as many as asked; faster plain decoding, but a
    row's arithmetic then depends on the row count, see elpis/exl3/backend.py).
    `gdn_state_fp32`: store the Gated DeltaNet recurrent state in fp32 (ExLlamaV3's default is fp16, rounded
    once per forward pass, so a state advanced by an 8-row pass differs from one advanced token by token and
    accepted drafts can change the output; measured on the H200, bench/results/lossless-2026-11-30.md).
    `tree`: verify token trees through elpis's tree kernels (`elpis.exl3.tree_verify`); every verify, plain
    decoding included, then runs as `tree_rows` rows (8 or 16: trees of up to that many rows), which
    replaces `fixed_rows`. Needs `gdn_state_fp32`. Off by default here (the library's callers choose);
    `elpis serve` turns it on with a DFlash2 draft, on issue 8's evidence (bench/results/tree/README.md).
    `tree_graphs` (tree mode only): replay tree verifies from CUDA graphs captured per (rows, context bucket,
    recurrent slot) (`elpis.exl3.tree_graph`) instead of running ExLlamaV3's forward eagerly; bit-identical
    to the eager forward and lossless (bench/results/tree/README.md), so on by default.
    `draft_graphs`: replay the DFlash2 draft block from a CUDA graph per block-table width
    (`elpis.exl3.draft_graph`) instead of ExLlamaV3's eager draft forward: 0.65-1.9 ms less per round at 1K
    on the H200 (bench/results/tree/README.md, session 8). The draft only proposes, so the output is the
    same either way.
    `prefill_chunk`: tokens per prefill chunk, one of `PREFILL_CHUNKS`. 2048 (ExLlamaV3's own) keeps its
    arithmetic; 8192 prefills cold prompts up to 1.2x faster and passed the quality gate, but the prefix
    cache then resumes follow-up turns only at multiples of 8192 tokens (see the note at the top).
    `rows_gemm`: the EXL3 linears of 1-16 rows (every verify and draft block) run elpis's GEMM
    (`elpis.exl3.rows_gemm_patch`) instead of ExLlamaV3's; None: `default_rows_gemm(tree)`. True with the
    patch switched off is refused, and so is a build whose decode differs from the format's
    (`elpis.exl3.decode_check`, run before the weights load).
    `gdn_ba`: inside tree verifies, the Gated DeltaNet gate projections b and a run as two launches of elpis's
    kernel (`elpis.exl3.gdn_ba_patch`); None: `default_gdn_ba(tree)`. Tree mode only; True with the patch
    switched off is refused.
    `prefill_group`: 2048-token chunks prefilled layer-major per group of this many
    (`elpis.exl3.prefill_groups`; the same arithmetic as chunk by chunk, each EXL3 weight rebuilt once per
    group); None: `default_prefill_group(prefill_chunk)`. More than 1 with the patch switched off is refused.
    `host_threads`: torch's CPU threads between prefills (`torch.set_num_threads`; `begin()` prefills with the
    count torch had before, for its CPU embedding lookups); None leaves torch's setting alone. A round's host
    work is small tensors (embedding rows, uploads). With torch's default 16 threads on the H200 machine, up
    to two rounds in three stalled ~10 ms there (device call 65); with 1 thread every round of the
    served bench stayed within 17.6-21.0 ms beside stock (call 66), hence the default.
    `capture_graphs` (tree graphs only): capture every verify, commit, conditioning and draft-block graph of
    the contexts up to `max_context` now (`elpis.exl3.graph_warmup`) rather than in the first round that
    reaches each context bucket, which otherwise adds ~150 ms to that request's time to first token. The
    report is `backend.warmup`.
    `prelaunch` (tree graphs only): queue each round's verify graph behind the verify gate while the draft
    runs, and open it with the tree (`elpis.exl3.verify_gate`): the same replay, its launch off the GPU's
    idle time (rounds 0.18-0.19 ms shorter on the H200, within noise, so off by default). None:
    `default_prelaunch`.
    `embed_gather` (tree or draft graphs only): the captured graphs gather their embedding rows on the GPU
    from ExLlamaV3's host table, registered as mapped pinned memory (2.5 GB of page-locked host memory for
    Qwen3.8), instead of the host looking them up and uploading them before each replay
    (`elpis.exl3.embed_gather`); the same values. None: `default_embed_gather`. True with the patch
    switched off is refused.
    `device_rounds` (tree mode, tree and draft graphs, the embedding gather; faster than host rounds):
    greedy requests run their rounds' tree, acceptance and commit on the GPU (`elpis.exl3.device_round`),
    one host synchronisation a round. None: the registry switch exl3-device-rounds (on since session 41),
    where they apply (`default_device_rounds`). True with the switch off, or without what it needs, is
    refused.
    `run_choice` (rounds on the GPU, graphs captured at load, 16 tree rows): each round on the GPU verifies at
    8 or 16 rows, whichever commits more tokens a second by the rounds' own counts and the graphs' times
    measured at load (`elpis.spec.run_choice`); every row's logits are the same at either, so the text is.
    None: the registry switch exl3-run-choice, where it applies (`default_run_choice`). True with the switch
    off, or where it does not apply, is refused.
    """
    import torch

    from elpis.exl3.tree_verify import TREE_RUNS

    check_prefill_chunk(prefill_chunk)
    check_host_threads(host_threads)
    if prefill_group is not None:
        check_prefill_group(prefill_group, prefill_chunk)
    if prelaunch and not (tree and tree_graphs):
        raise ValueError("prelaunch queues replays of tree verifies: it needs tree=True and tree_graphs=True")
    if not torch.cuda.is_available():
        raise RuntimeError("the exl3 backend needs a CUDA GPU (use --backend reference on CPU)")
    from elpis.exl3.backend import Exl3Backend
    from elpis.exl3.engine import CACHE_TOKENS, load_engine
    from elpis.exl3.persist import bound_cache_dir

    if not 1 <= max_context <= CACHE_TOKENS - 16:
        raise ValueError(f"max_context must be in 1..{CACHE_TOKENS - 16}, got {max_context}")
    if tree and not gdn_state_fp32:
        raise ValueError("tree mode needs gdn_state_fp32=True (the tree kernels keep the GDN state in fp32)")
    if tree:
        from elpis.exl3.tree_verify import require_tree_patch

        require_tree_patch()
    if rows_gemm is None:
        rows_gemm = default_rows_gemm(tree)
    if gdn_ba is None:
        gdn_ba = default_gdn_ba(tree)
    if prefill_group is None:
        prefill_group = default_prefill_group(prefill_chunk)
    if prelaunch is None:
        prelaunch = default_prelaunch(tree and tree_graphs)
    graphs = (tree and tree_graphs) or (draft_dir is not None and draft_graphs)
    if embed_gather is None:
        embed_gather = default_embed_gather(graphs)
    if embed_gather:
        from elpis.exl3 import patches
        from elpis.exl3.embed_gather import PATCH as EMBED_PATCH

        if not patches.enabled(EMBED_PATCH):
            raise ValueError(f"embed_gather=True, but the registry patch {EMBED_PATCH} is switched off")
        if not graphs:
            raise ValueError(
                "embed_gather acts inside captured tree verifies and draft blocks: it needs either"
            )
    if gdn_ba and not tree:
        raise ValueError("gdn_ba acts inside tree verifies only: it needs tree=True")
    has_draft_graphs = draft_dir is not None and draft_graphs
    if device_rounds is None:
        applies = tree and tree_graphs and has_draft_graphs and embed_gather and not prelaunch
        device_rounds = default_device_rounds(applies)
    if device_rounds:
        check_device_rounds(tree and tree_graphs, has_draft_graphs, embed_gather, prelaunch)
    choice_applies = bool(device_rounds) and capture_graphs and tree_rows > TREE_RUNS[0]
    if run_choice is None:
        run_choice = default_run_choice(choice_applies)
    if run_choice:
        check_run_choice(choice_applies)
    if rows_gemm:  # before the weights load: elpis's decode as this machine's CUDA compiler built it
        from elpis.exl3 import decode_check

        decode_check.check_decode(decode_check.gpu_decode(torch.device("cuda")))  # DecodeMismatch refuses
    engine = load_engine(
        Path(model_dir),
        Path(draft_dir) if draft_dir else None,
        warmup=warmup,
        recurrent_dtype=torch.float if gdn_state_fp32 else torch.half,
        prefill_chunk=prefill_chunk,
        rows_gemm=rows_gemm,
    )
    if gdn_ba:  # after load_engine, which applies the registry patches; mark refuses them switched off
        from elpis.exl3.gdn_ba_patch import mark

        mark(engine.model)
    if tree and rows_gemm:
        from elpis.exl3 import patches
        from elpis.exl3 import rows_gemm_patch as rgp

        if patches.enabled(rgp.QKV_PATCH):  # switches: off by default (patches/registry.json)
            rgp.mark_gdn_qkv(engine.model)
        if patches.enabled(rgp.ACT_PATCH):
            rgp.mark_mlp_act(engine.model)
        if patches.enabled(rgp.NORM_PATCH):
            rgp.mark_norm_input(engine.model)
    disk = bound_cache_dir(Path(disk_cache_dir), engine) if disk_cache_dir else None
    backend = Exl3Backend(
        engine,
        model_id=model_id,
        max_context=max_context,
        fixed_rows=tree_rows if tree else fixed_rows,
        host_cache_bytes=int(host_cache_gib * GiB),
        disk_cache_dir=disk,
        prefix_cache=prefix_cache,
        tree=tree,
        tree_graphs=tree and tree_graphs,
        draft_graphs=draft_graphs,
        prefill_group=prefill_group,
        host_threads=host_threads,
        prelaunch=prelaunch,
        embed_gather=embed_gather,
    )
    if run_choice:
        backend.runs = tuple(r for r in TREE_RUNS if r <= tree_rows)
    if tree and tree_graphs and capture_graphs:
        from elpis.exl3.graph_warmup import capture_graphs as capture_all

        backend.warmup = capture_all(backend, device_rounds=bool(device_rounds))
    if device_rounds:
        from elpis.exl3.device_round import DeviceRounds

        backend.device_rounds = DeviceRounds(backend)
    if run_choice:  # one choice for the host's rounds and the GPU's (DeviceRounds.choice): the same rows
        from elpis.spec.run_choice import RunChoice

        backend.run_choice = RunChoice(backend.tree_runs(), backend.round_cost)
    return backend


RUN_CHOICE_PATCH = "exl3-run-choice"  # the registry switch (patches/registry.json)


def default_run_choice(applicable: bool = True) -> bool:
    """Whether rounds on the GPU choose their row count (`elpis.spec.run_choice`) when the caller does not
    say: where it applies (`check_run_choice`), as the registry switch exl3-run-choice says."""
    from elpis.exl3 import patches

    return applicable and patches.enabled(RUN_CHOICE_PATCH)


def check_run_choice(applicable: bool) -> None:
    """Refuse run_choice=True with its switch off or where it cannot act."""
    from elpis.exl3 import patches
    from elpis.exl3.tree_verify import TREE_RUNS

    if not patches.enabled(RUN_CHOICE_PATCH):
        raise ValueError(f"run_choice=True, but the registry patch {RUN_CHOICE_PATCH} is switched off")
    if not applicable:
        raise ValueError(
            "run_choice=True needs rounds on the GPU, graphs captured at load (capture_graphs=True) and "
            f"tree_rows above {TREE_RUNS[0]} (a choice of more than one row count)"
        )


def default_device_rounds(applicable: bool = True) -> bool:
    """Whether greedy rounds run on the GPU (`elpis.exl3.device_round`) when the caller does not say: where
    they apply (tree mode with tree and draft graphs, the embedding gather, no verify gate:
    `check_device_rounds`' list), as the registry switch exl3-device-rounds says; so a configuration they do
    not apply to (chain mode, no draft) loads with host rounds, as rows-gemm's default follows tree mode. A
    caller that asks for them (device_rounds=True) where they do not apply is refused."""
    from elpis.exl3 import patches
    from elpis.exl3.device_round import PATCH

    return applicable and patches.enabled(PATCH)


def check_device_rounds(tree_graphs: bool, draft_graphs: bool, embed_gather: bool, prelaunch: bool) -> None:
    """Refuse rounds on the GPU without what they need: the switch on, captured tree verifies and draft
    blocks (the GPU writes their inputs), the embedding gather (the host never sees the tree's ids) and no
    verify gate (they queue their own verify)."""
    from elpis.exl3 import patches
    from elpis.exl3.device_round import PATCH

    missing = [
        name
        for name, ok in (
            (f"the registry switch {PATCH}", patches.enabled(PATCH)),
            ("tree mode with tree graphs", tree_graphs),
            ("a DFlash2 draft with draft graphs", draft_graphs),
            ("the embedding gather (exl3-embed-gather)", embed_gather),
            ("no verify gate (exl3-verify-prelaunch off)", not prelaunch),
        )
        if not ok
    ]
    if missing:
        raise ValueError(f"device_rounds=True needs {', '.join(missing)}")


def check_host_threads(host_threads: int | None) -> None:
    if host_threads is not None and not 1 <= host_threads <= 1024:
        raise ValueError(f"host_threads must be None or in 1..1024, got {host_threads}")


def walk_modules(model: Any) -> Iterator[Any]:
    """Every module of an ExLlamaV3 model (its `modules` lists, recursively), each once."""
    seen: set[int] = set()
    stack = list(getattr(model, "modules", []))
    while stack:
        module = stack.pop()
        if id(module) in seen:
            continue
        seen.add(id(module))
        yield module
        stack.extend(getattr(module, "modules", []) or [])


__all__ = [
    "DEFAULT_PREFILL_CHUNK",
    "DEFAULT_PREFILL_GROUP",
    "EXLLAMA_PREFILL_CHUNK",
    "PREFILL_CHUNKS",
    "RUN_CHOICE_PATCH",
    "check_device_rounds",
    "check_prefill_chunk",
    "check_prefill_group",
    "check_run_choice",
    "default_device_rounds",
    "default_embed_gather",
    "default_prefill_group",
    "default_prelaunch",
    "default_run_choice",
    "load_backend",
    "walk_modules",
]
