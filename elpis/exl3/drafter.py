"""The DFlash2 drafter as an `elpis.backend.Drafter`, bound to one `Exl3Backend`.

One draft pass per call: the block `[anchor, mask x 7]` runs through the draft model over its K/V (built
from the target's tap states by the backend), the target's head turns the 7 block rows into logits, and
ExLlamaV3's DFlash2 selector walks the top-16 candidates of each row into the greedy chain it would verify.
Candidates per depth: the selector's chain token first, then the row's most likely other tokens; each with
its log-probability under the draft's logits (log-softmax over the whole vocabulary), so a tree builder can
rank them. The drafter proposes for the backend's current sequence only: `context` must be the backend's
committed tokens plus the anchor. With `graphs`, the block after the input layer is replayed from a CUDA
graph per context bucket (`elpis.exl3.draft_graph`). The candidates come from one kernel
(`elpis.exl3.draft_candidates`) where the registry switch exl3-draft-candidates is on, else from torch's
composition (`block_candidates`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from elpis.backend import DraftBlock
from elpis.exl3.upload import pinned

if TYPE_CHECKING:
    from elpis.exl3.backend import Exl3Backend
    from elpis.exl3.draft_graph import DraftGraphs


Candidates = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]


def choose_candidates(fused: bool | None = None) -> Candidates:
    """The function that packs a block's candidates: the one-launch kernel (`fused`, or by default the
    registry switch exl3-draft-candidates) or torch's composition."""
    from elpis.exl3 import draft_candidates, patches

    if fused is None:
        fused = patches.enabled(draft_candidates.PATCH)
    if not fused:
        return block_candidates
    draft_candidates.load()
    return draft_candidates.candidates


class DFlash2Drafter:
    def __init__(self, backend: Exl3Backend, *, graphs: bool = False, embed_gather: bool = False) -> None:
        self.backend = backend
        # read once: a registry read per block would be host time on every round
        self.candidates = choose_candidates()
        engine = backend.engine
        self.model = engine.draft
        self.config = engine.draft_config
        self.depth = int(self.config.block_size) - 1
        self.last_seconds = 0.0
        self.graphs: DraftGraphs | None = None
        if graphs:
            from elpis.exl3.draft_graph import DraftGraphs

            self.graphs = DraftGraphs(engine, embed_gather=embed_gather)

    def reset(self) -> None:
        """Nothing per sequence lives here: the draft's K/V belong to the backend's sequence."""

    def _check_context(self, context: Sequence[int]) -> int:
        backend = self.backend
        if not backend.active:
            raise RuntimeError("DFlash2 drafter: the backend has no active sequence")
        if len(context) != backend.position() + 1:
            raise ValueError(
                f"DFlash2 drafter: context has {len(context)} tokens, the backend holds "
                f"{backend.position()} plus the anchor"
            )
        if backend.anchor is not None and int(context[-1]) != backend.anchor:
            raise ValueError("DFlash2 drafter: context's last token is not the backend's anchor")
        return int(context[-1])

    @torch.inference_mode()
    def block(self, anchor: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The selector's chain (7 ids) and the draft logits of the 7 block rows, on the GPU."""
        backend, engine = self.backend, self.backend.engine
        from elpis.exl3.backend import stock_table_width

        kvp = backend.position()
        block = self.depth + 1
        backend.ensure_pages(kvp + block)
        if self.graphs is not None:
            from elpis.exl3.draft_graph import block_pages

            pages = block_pages(backend.pages, kvp, block)
            return self.graphs.block(anchor, pages, kvp, self.graphs.width(kvp))
        width = stock_table_width(kvp + 1 + block)
        params: dict[str, Any] = {
            "attn_mode": "flash_attn",
            "block_table": backend.block_table(width),
            "cache": engine.draft_cache,
            "cache_seqlens": pinned([kvp], torch.int32),
            # the round's token read-back is the sync point before the staging buffer is reused
            "pinned_staging": True,
        }
        ids = torch.tensor([[anchor]], dtype=torch.long)
        state = self.model.forward(ids, params)[:, 1:]  # rows predicting positions kvp+1 .. kvp+7
        head = engine.model.modules[engine.model.logit_layer_idx]
        logits = head.forward(head.prepare_for_device(state.half().contiguous(), params), params)
        vocab = engine.vocab_size
        selector = self.model.selector
        chain, _ = selector.walk_block(
            state,
            logits,
            torch.tensor([anchor], dtype=torch.long),
            vocab_size=vocab,
            scale=self.config.output_multiplier,
            softcap=self.config.final_logit_softcapping,
        )
        return chain[0, 1:], logits[0, :, :vocab]

    @torch.inference_mode()
    def propose(self, context: Sequence[int], depth: int, top_k: int) -> DraftBlock:
        if depth < 0 or top_k < 1:
            raise ValueError(f"depth must be >= 0 and top_k >= 1, got {depth}, {top_k}")
        anchor = self._check_context(context)
        depth = min(depth, self.depth)
        if depth == 0:
            return DraftBlock([])
        chain, logits = self.block(anchor)
        packed = self.candidates(chain[:depth], logits[:depth], top_k)
        host = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=True)
        host.copy_(packed, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        # the next verify queued behind its gate while the draft runs (a no-op unless the backend was loaded
        # with prelaunch); the read-back below waits for the candidates only
        self.backend.prelaunch()
        ready.synchronize()
        return DraftBlock(unpack_candidates(host.tolist(), (packed.shape[1] - 2) // 2))


# Token ids travel as float32 in the one read-back: exact below 2^24 (the vocabulary is 248,320).
EXACT_FLOAT32_IDS = 1 << 24


def block_candidates(chain: torch.Tensor, logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """A draft block's candidates on the GPU, packed (`pack_candidates`): per row the selector's chain token,
    then the top-k, each with its log-probability under the row's log-softmax over the whole vocabulary."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    chain_lp = logprobs.gather(1, chain[:, None])[:, 0]
    top = torch.topk(logprobs, min(top_k, logprobs.shape[-1]), dim=-1)
    return pack_candidates(chain, chain_lp, top.indices, top.values)


def pack_candidates(
    chain: torch.Tensor, chain_lp: torch.Tensor, top_ids: torch.Tensor, top_lp: torch.Tensor
) -> torch.Tensor:
    """The draft's device tensors as one float32 [depth, 2 + 2k] tensor, read back in one transfer (one host
    sync per block): per row the selector's chain token and its log-probability, then the top-k ids and
    their log-probabilities."""
    depth = top_ids.shape[0]
    if chain.shape != (depth,) or chain_lp.shape != (depth,) or top_lp.shape != top_ids.shape:
        raise ValueError("draft candidates: the chain, its log-probabilities and the top-k rows disagree")
    return torch.cat(
        (chain[:, None].float(), chain_lp[:, None].float(), top_ids.float(), top_lp.float()), dim=1
    )


def unpack_candidates(packed: list[list[float]], k: int) -> list[list[tuple[int, float]]]:
    """Candidates per depth from `pack_candidates`' rows: the selector's chain token first with its
    log-probability, then the row's most likely other tokens, k in all. Log-probabilities are clamped to
    <= 0 (a rounding above 0 is not a probability)."""
    rows: list[list[tuple[int, float]]] = []
    for values in packed:
        if len(values) != 2 + 2 * k:
            raise ValueError(f"draft candidates: a packed row of {len(values)} values for k = {k}")
        ids, lps = values[2 : 2 + k], values[2 + k :]
        if max(values[0], *ids) >= EXACT_FLOAT32_IDS:
            raise ValueError(f"draft candidates: ids of {EXACT_FLOAT32_IDS} or more cannot be read back")
        row = [(int(values[0]), min(0.0, values[1]))]
        for token, lp in zip(ids, lps, strict=True):
            if len(row) == k:
                break
            if int(token) != row[0][0]:
                row.append((int(token), min(0.0, lp)))
        rows.append(row)
    return rows
