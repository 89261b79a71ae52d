"""The DFlash2 drafter as an `elpis.backend.Drafter`, bound to one `Exl3Backend`.

One draft pass per call: the block `[anchor, mask x 7]` runs through the draft model over its K/V (built
from the target's tap states by the backend), the target's head turns the 7 block rows into logits, and
ExLlamaV3's DFlash2 selector walks the top-16 candidates of each row into the greedy chain it would verify.
Candidates per depth: the selector's chain token first, then the row's most likely other tokens; each with
its log-probability under the draft's logits (log-softmax over the whole vocabulary), so a tree builder can
rank them. The drafter proposes for the backend's current sequence only: `context` must be the backend's
committed tokens plus the anchor.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from elpis.backend import DraftBlock
from elpis.exl3.upload import pinned

if TYPE_CHECKING:
    from elpis.exl3.backend import Exl3Backend


class DFlash2Drafter:
    def __init__(self, backend: Exl3Backend) -> None:
        self.backend = backend
        engine = backend.engine
        self.model = engine.draft
        self.config = engine.draft_config
        self.depth = int(self.config.block_size) - 1
        self.last_seconds = 0.0

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
        params: dict[str, Any] = {
            "attn_mode": "flash_attn",
            "block_table": backend.block_table(stock_table_width(kvp + 1 + block)),
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
        logprobs = torch.log_softmax(logits[:depth].float(), dim=-1)
        chain = chain[:depth]
        chain_lp = logprobs.gather(1, chain[:, None])[:, 0]
        k = min(top_k, logprobs.shape[-1])
        top = torch.topk(logprobs, k, dim=-1)
        chain_l, chain_lp_l = chain.tolist(), chain_lp.tolist()  # one host sync for the whole block
        top_ids, top_lp = top.indices.tolist(), top.values.tolist()
        candidates: list[list[tuple[int, float]]] = []
        for d in range(depth):
            row = [(int(chain_l[d]), min(0.0, float(chain_lp_l[d])))]
            for token, lp in zip(top_ids[d], top_lp[d], strict=True):
                if len(row) == k:
                    break
                if token != row[0][0]:
                    row.append((int(token), min(0.0, float(lp))))
            candidates.append(row)
        return DraftBlock(candidates)
