"""A scripted backend for HTTP tests of the parsers: the real generator, acceptor, server and client run;
only the "model" is a script.

`ScriptedBackend` implements `elpis.backend.Backend`. The prompt names a script with `SCRIPT:<name>`
(the last such marker wins); the backend then puts all logit mass of generation step g on the script's
g-th token and ends with an end-of-turn token. Every row's logits depend only on its absolute position, as
for a real model that has learnt the script, so speculation commits exactly the script. It keeps a real
prefix cache (the longest common prefix with every finished sequence) so `cached_tokens` is exercised,
can be slowed down per verify call (disconnect and queue tests), and fails on `SCRIPT:explode` (fatal
engine error tests).

The scripts the HTTP tests share (`SCRIPTS`), the service over them and a running server live here too.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

from elpis.backend import BackendError, BackendInfo
from elpis.server.service import ModelService
from elpis.spec import SpeculativeGenerator
from elpis.spec.drafters import NgramDrafter

from .conftest import RunningServer, running_server

_MARKER = re.compile(r"SCRIPT:(\w+)")


class ScriptedBackend:
    def __init__(self, tokenizer, scripts: dict[str, str], *, max_context: int = 4096, delay_s: float = 0.0):
        self.tokenizer = tokenizer
        self.end_of_turn = tokenizer.eos_ids[0]
        self.info = BackendInfo(
            name="scripted",
            model_id="scripted",
            vocab_size=tokenizer.vocab_size,
            max_context=max_context,
            stop_token_ids=tuple(tokenizer.eos_ids),
            device="cpu",
        )
        self.scripts = {name: tokenizer.encode(text) for name, text in scripts.items()}
        self.delay_s = delay_s
        self.verify_calls = 0
        self.begun: list[str] = []  # script names, in the order their sequences began
        self.prompts: list[list[int]] = []  # every prompt begun (to assert what the template rendered)
        self._finished: list[list[int]] = []
        self._lock = threading.Lock()  # detects overlapping sequences (the scheduler must prevent them)
        self._active = False

    def add_script(self, name: str, text: str) -> None:
        self.scripts[name] = self.tokenizer.encode(text)

    # --- Backend protocol -----------------------------------------------------------------------------

    def begin(self, prompt: Sequence[int]) -> int:
        with self._lock:
            if self._active:
                raise AssertionError("two sequences at once")
            self._active = True
        prompt = [int(t) for t in prompt]
        self.prompts.append(prompt)
        names = _MARKER.findall(self.tokenizer.decode(prompt))
        name = names[-1] if names else "default"
        self.begun.append(name)
        if name == "explode":
            self._active = False
            raise BackendError("scripted device failure")
        self._script = [*self.scripts.get(name, self.scripts.get("default", [])), self.end_of_turn]
        self._prompt_len = len(prompt)
        self._tokens = prompt[:-1]  # tokens whose effect is in the state
        self._anchor = prompt[-1]
        cached = 0
        for done in self._finished:
            common = 0
            for a, b in zip(done, self._tokens, strict=False):
                if a != b:
                    break
                common += 1
            cached = max(cached, common)
        return cached

    def verify(self, tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        self.verify_calls += 1
        if self.delay_s:
            time.sleep(self.delay_s)
        depths: list[int] = []
        for parent in parents:
            depths.append(0 if parent < 0 else depths[parent] + 1)
        logits = torch.full((len(tokens), self.info.vocab_size), -20.0, dtype=torch.float32)
        for row, depth in enumerate(depths):
            step = len(self._tokens) + depth + 1 - self._prompt_len
            token = self._script[step] if step < len(self._script) else self.end_of_turn
            logits[row, token] = 20.0
        self._verified = [int(t) for t in tokens]
        return logits

    def commit(self, rows: Sequence[int]) -> None:
        self._tokens.extend(self._verified[r] for r in rows)

    def finish(self) -> None:
        if self._active:
            self._finished.append(list(self._tokens))
        self._active = False

    def position(self) -> int:
        return len(self._tokens)


CALL = (
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
)
SCRIPTS = {
    "default": "Default.\n</think>\n\nDefault answer.",
    "hello": "The user greets me.\nI greet back.\n</think>\n\nHello! How can I help?",
    "nothink": "Plain answer, no reasoning.",
    "tool": "Needs the weather tool.\n</think>\n\nLet me check.\n\n" + CALL,
    "two_tools": "Two cities.\n</think>\n\n" + CALL + "\n" + CALL.replace("Paris", "Rome"),
    "after_tool": "The tool said sunny.\n</think>\n\nIt will be sunny in Paris for 3 days.",
    "broken": "Hmm.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</function>\n"
    "</tool_call>",
    "repeat": "</think>\n\n"
    + "one two three four five six. " * 6
    + "HALT and more text after. "
    + "seven " * 20,
    "long": "</think>\n\n" + " ".join(f"w{i}" for i in range(400)),
}


def scripted_service(
    qwen_text, *, delay_s: float = 0.0, drafter: bool = True
) -> tuple[ModelService, ScriptedBackend]:
    tokenizer, template = qwen_text
    backend = ScriptedBackend(tokenizer, dict(SCRIPTS), delay_s=delay_s)
    for i in range(50):
        backend.add_script(f"client{i}", f"</think>\n\nClient {i} gets answer {i * i}.")
    generator = SpeculativeGenerator(
        backend, tokenizer, drafter=NgramDrafter() if drafter else None, tree_budget=8
    )
    service = ModelService("scripted", tokenizer, template, generator, max_context=4096)
    # The scripts are fixed texts, some deliberately malformed, that these tests expect back verbatim; a
    # tool-call grammar would rewrite them. Grammars are tested on real models (test_http_reference,
    # test_toolgrammar).
    service.grammar_vocabulary = None
    return service, backend


@contextmanager
def scripted_server(qwen_text, *, delay_s: float = 0.0, drafter: bool = True,
                    **limits: int) -> Iterator[RunningServer]:
    """A running server over `scripted_service`, its backend at `server.backend` (it keeps every prompt)."""
    service, backend = scripted_service(qwen_text, delay_s=delay_s, drafter=drafter)
    with running_server(lambda: service, **limits) as server:
        server.backend = backend
        yield server
