"""What a generation is asked for and what each round hands back."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from elpis.spec.grammar import Grammar
from elpis.spec.sampling import MAX_TOP_LOGPROBS, SamplingParams
from elpis.spec.thinking import ThinkingBudget

MAX_STOP_TOKEN_IDS = 4  # what the proven acceptor takes; more are refused, never enforced another way

# (token id, log-probability, [(alternative id, log-probability), ...])
TokenLogprob = tuple[int, float, list[tuple[int, float]]]


def _ids(name: str, values: Sequence[int]) -> tuple[int, ...]:
    out = tuple(values)
    for value in out:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must hold non-negative integer token ids, got {value!r}")
    return out


@dataclass(frozen=True)
class GenerationRequest:
    prompt_ids: tuple[int, ...]
    max_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    ignore_eos: bool = False
    top_logprobs: int | None = None
    grammar: Grammar | None = None  # structured output: the tokens each draw may take (elpis.spec.grammar)
    # reasoning tokens at most, for a prompt that opens the model's thinking block (elpis.spec.thinking)
    thinking: ThinkingBudget | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt_ids", _ids("prompt_ids", self.prompt_ids))
        object.__setattr__(self, "stop_token_ids", _ids("stop_token_ids", self.stop_token_ids))
        object.__setattr__(self, "stop_strings", tuple(self.stop_strings))
        if not self.prompt_ids:
            raise ValueError("prompt_ids must not be empty (the last prompt token is the first anchor)")
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not isinstance(self.sampling, SamplingParams):
            raise ValueError(f"sampling must be SamplingParams, got {type(self.sampling).__name__}")
        for stop in self.stop_strings:
            if not isinstance(stop, str) or not stop:
                raise ValueError(f"stop strings must be non-empty strings, got {stop!r}")
        if self.top_logprobs is not None and (
            isinstance(self.top_logprobs, bool)
            or not isinstance(self.top_logprobs, int)
            or not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS
        ):
            raise ValueError(f"top_logprobs must be in 0..{MAX_TOP_LOGPROBS}, got {self.top_logprobs!r}")
        if self.grammar is not None and not isinstance(self.grammar, Grammar):
            raise ValueError(f"grammar must be a Grammar, got {type(self.grammar).__name__}")
        if self.thinking is not None and not isinstance(self.thinking, ThinkingBudget):
            raise ValueError(f"thinking must be a ThinkingBudget, got {type(self.thinking).__name__}")
        if self.grammar is not None and self.ignore_eos:
            # A complete grammar allows only the end of the sequence; ignoring it would leave the grammar.
            raise ValueError("ignore_eos cannot be combined with a grammar (structured output)")


def stop_ids_for(request: GenerationRequest, model_stop_ids: Sequence[int]) -> tuple[int, ...]:
    """The model's stop ids (unless ignore_eos) then the request's, without repeats; at most 4."""
    ids = tuple(dict.fromkeys((*(() if request.ignore_eos else model_stop_ids), *request.stop_token_ids)))
    if len(ids) > MAX_STOP_TOKEN_IDS:
        raise ValueError(
            f"at most {MAX_STOP_TOKEN_IDS} stop token ids are supported, including the model's own "
            f"{tuple(model_stop_ids) if not request.ignore_eos else ()}; got {len(ids)}: {ids}"
        )
    return ids


@dataclass
class GenerationStats:
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int = 0
    rounds: int = 0
    committed_per_round: list[int] = field(default_factory=list)  # tokens the acceptor committed
    accepted_depths: list[int] = field(default_factory=list)  # draft rows accepted (committed - 1)
    tree_rows: list[int] = field(default_factory=list)  # rows verified
    # Fault tolerance (elpis.spec.integrity): faults detected, by RoundFault.kind (each discards its round
    # attempt, except a result of a round on the device fetched again: elpis.exl3.device_round), the attempts
    # discarded, and rounds committed after at least one fault.
    faults_detected: dict[str, int] = field(default_factory=dict)
    rounds_discarded: int = 0
    rounds_recovered: int = 0

    def count_fault(self, kind: str, *, discarded: bool = True) -> None:
        """One fault of `kind` detected; `discarded`: its round attempt was dropped (else its result was
        fetched again)."""
        self.faults_detected[kind] = self.faults_detected.get(kind, 0) + 1
        self.rounds_discarded += int(discarded)

    @property
    def tokens_per_round(self) -> float:
        return sum(self.committed_per_round) / self.rounds if self.rounds else 0.0


@dataclass(frozen=True)
class Step:
    """One round's output. `token_ids` are cut after a stop (a stop token id is included, its text is
    not; after a stop string, tokens past the one completing it are dropped)."""

    token_ids: list[int]
    text: str
    logprobs: list[TokenLogprob] | None = None
    finish_reason: str | None = None  # None while running; "stop" | "length" | "cancelled" at the end
    stats: GenerationStats | None = None  # on the last step only
    stop_string: str | None = None  # on the last step, the stop string that ended the text, if one did
