"""Shared fixtures: tiny random models (two seeds) written and loaded once, backends over them, and a helper
that runs one request to the end."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from elpis.backend import Drafter
from elpis.reference.backend import ReferenceBackend
from elpis.reference.loader import load_model
from elpis.reference.model import ReferenceModel
from elpis.reference.synth import write_tiny
from elpis.spec import GenerationRequest, GenerationStats, SpeculativeGenerator, Step
from elpis.spec.drafters import AdversarialDrafter, NgramDrafter, OracleDrafter
from elpis.spec.grammar import GrammarTokenizer
from elpis.text import Tokenizer, load_tokenizer

TINY_SEEDS = (0, 1)


@dataclass
class TinyModel:
    seed: int
    path: Path
    model: ReferenceModel
    tokenizer: Tokenizer

    def backend(self, max_context: int = 4096) -> ReferenceBackend:
        """A fresh backend (own state and prefix cache) over the shared weights."""
        return ReferenceBackend(self.model, model_id=f"tiny{self.seed}", max_context=max_context,
                                stop_token_ids=self.tokenizer.eos_ids or (248046,))


class RecordingBackend:
    """A real backend that also records the (tokens, parents) of every verify call."""

    def __init__(self, inner) -> None:
        self.inner, self.info, self.verified = inner, inner.info, []
        self.begin, self.commit = inner.begin, inner.commit
        self.finish, self.position = inner.finish, inner.position

    def verify(self, tokens, parents):
        self.verified.append((tuple(tokens), tuple(parents)))
        return self.inner.verify(tokens, parents)

    def depths(self) -> list[int]:
        """Deepest row of each verify call."""
        out = []
        for _, parents in self.verified:
            depth = [0] * len(parents)
            for r in range(1, len(parents)):
                depth[r] = depth[parents[r]] + 1
            out.append(max(depth))
        return out


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[int, TinyModel]:
    models = {}
    for seed in TINY_SEEDS:
        path = write_tiny(tmp_path_factory.mktemp(f"tiny{seed}") / "model", seed=seed)
        models[seed] = TinyModel(seed, path, load_model(path, dtype=torch.float32), load_tokenizer(path))
    return models


@dataclass
class Outcome:
    token_ids: list[int]
    text: str
    finish_reason: str
    logprobs: list | None
    stats: GenerationStats
    steps: list[Step]

    def same_output(self, other: Outcome) -> bool:
        return (self.token_ids, self.text, self.finish_reason, self.logprobs) == (
            other.token_ids, other.text, other.finish_reason, other.logprobs)


def run_request(backend, tokenizer, request: GenerationRequest, drafter: Drafter | None = None,
                tree_budget: int = 8, should_stop: Callable[[], bool] = lambda: False) -> Outcome:
    generator = SpeculativeGenerator(backend, tokenizer, drafter=drafter, tree_budget=tree_budget)
    steps = list(generator.generate(request, should_stop=should_stop))
    assert steps and all(s.finish_reason is None and s.stats is None for s in steps[:-1])
    last = steps[-1]
    assert last.finish_reason is not None and last.stats is not None
    logprobs = None if request.top_logprobs is None else [lp for s in steps for lp in s.logprobs]
    token_ids = [t for s in steps for t in s.token_ids]
    return Outcome(token_ids, "".join(s.text for s in steps), last.finish_reason, logprobs, last.stats, steps)


@pytest.fixture(scope="session")
def run() -> Callable[..., Outcome]:
    return run_request


@pytest.fixture(scope="session")
def recording() -> type[RecordingBackend]:
    return RecordingBackend


@pytest.fixture(scope="session")
def vocabulary(tiny_models: dict[int, TinyModel]) -> GrammarTokenizer:
    """The grammar's view of the second tiny model's vocabulary (the grammar tests' model), built once."""
    model = tiny_models[1]
    info = model.backend().info
    return GrammarTokenizer(model.tokenizer.backend.to_str(), info.vocab_size, info.stop_token_ids)


def speculation_drafters(model: TinyModel, request: GenerationRequest) -> dict[str, Drafter]:
    """The drafters an invariance test runs a request with: an oracle of the request itself (its sampling,
    adjustments and grammar), prompt lookup, and an adversary built on the oracle."""
    oracle = OracleDrafter(model.backend(), request.sampling, prompt_length=len(request.prompt_ids),
                           grammar=request.grammar)
    return {
        "oracle": oracle,
        "ngram": NgramDrafter(max_ngram=3),
        "adversarial": AdversarialDrafter(oracle, model.backend().info.stop_token_ids,
                                          model.model.config.vocab_size, seed=4),
    }


def assert_speculation_is_plain(model: TinyModel, request: GenerationRequest, plain: Outcome) -> None:
    """Every drafter of `speculation_drafters`, at budgets 4 and 16, gives `plain`'s output; the oracle's
    drafts are accepted (fewer rounds), so rows past the anchor really were drawn from."""
    for name, drafter in speculation_drafters(model, request).items():
        for budget in (4, 16):
            got = run_request(model.backend(), model.tokenizer, request, drafter, tree_budget=budget)
            assert got.same_output(plain), (name, budget)
            if name == "oracle":
                assert got.stats.rounds < plain.stats.rounds, (budget, got.stats.rounds, plain.stats.rounds)
