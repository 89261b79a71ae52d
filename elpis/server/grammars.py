"""Which grammar a chat request's answer follows (`elpis.spec.grammar`), or none.

- `response_format` json_object or json_schema: that JSON (json_object: any object).
- `structured_outputs` (vLLM's shape, chat and completions): its JSON schema, regex, choices or Lark grammar.
- tools with tool_choice required or a named function: tool calls only (`toolgrammar`, calls_only).
- tools with tool_choice auto: free text, but a `<tool_call>` the model begins is held to the tools' grammar
  (Qwen-family vocabularies, where `<tool_call>` is one token; elsewhere the decoder alone judges calls).
With thinking on, every chat grammar opens after `</think>`: the reasoning stays free. A completion's grammar
applies from its first token.
"""

from __future__ import annotations

from elpis.server.channels import THINK_CLOSE
from elpis.server.errors import APIError, bad_request
from elpis.server.protocol import ChatRequest, CompletionRequest, StructuredOutputs
from elpis.server.service import ModelService
from elpis.server.toolcalls import TOOL_CALL_OPEN, ToolCallDecoder
from elpis.server.toolgrammar import tool_call_lark
from elpis.spec.grammar import Grammar


def request_grammar(service: ModelService, chat: ChatRequest, reasoning: bool,
                    calls: ToolCallDecoder | None) -> Grammar | None:
    """The grammar for `chat` (see the module docstring); `reasoning`: the answer starts inside `<think>`;
    `calls`: the decoder of the request's tool calls (None when tools are off), whose tools, named choice
    and parallel flag the tool grammar follows.
    Call it off the event loop: the first grammar also builds the vocabulary's index (seconds for Qwen3.8's).
    A grammar that cannot be built is a 400 naming the field that asked for it."""
    formatted = chat.response_format is not None and chat.response_format.type != "text"
    if formatted:
        field = "response_format"
    elif chat.structured_outputs is not None:
        field = "structured_outputs"
    elif calls is not None:
        field = "tools"
    else:
        return None
    if service.grammar_vocabulary is None:
        if field == "tools":
            return None  # the decoder alone judges calls, as for any model without a grammar vocabulary
        raise _no_vocabulary(field)
    openers: list[int] = []
    if reasoning:
        close = service.single_token(THINK_CLOSE)
        if close is None and field == "tools":
            return None  # as without a grammar vocabulary: the decoder alone judges calls
        if close is None:
            raise bad_request(f"a grammar after reasoning needs {THINK_CLOSE} as one token, which this "
                              f"vocabulary does not have; turn thinking off", field)
        openers.append(close)
    try:
        if field == "response_format":
            assert chat.response_format is not None
            schema = chat.response_format.answer_schema()
            assert schema is not None
            # strict: every keyword of the schema holds, and one llguidance does not implement is refused;
            # otherwise such keywords are ignored (OpenAI's non-strict mode promises no more).
            named = chat.response_format.json_schema
            lenient = named is None or not named.strict
            return Grammar.json_schema(service.grammar_vocabulary.get(), schema, openers, lenient=lenient)
        if field == "structured_outputs":
            assert chat.structured_outputs is not None
            return _structured(service, chat.structured_outputs, openers)
        assert calls is not None
        return _tool_grammar(service, calls, chat.tool_choice == "required", openers)
    except ValueError as exc:
        raise bad_request(f"{field}: {exc}", field) from None


def completion_grammar(service: ModelService, completion: CompletionRequest) -> Grammar | None:
    """The grammar of a completion's `structured_outputs`, from its first token, or None; off the event
    loop, like `request_grammar`."""
    if completion.structured_outputs is None:
        return None
    if service.grammar_vocabulary is None:
        raise _no_vocabulary("structured_outputs")
    try:
        return _structured(service, completion.structured_outputs, [])
    except ValueError as exc:
        raise bad_request(f"structured_outputs: {exc}", "structured_outputs") from None


def _no_vocabulary(field: str) -> APIError:
    return bad_request(f"{field} needs a grammar over the vocabulary, which needs a Hugging Face tokenizer; "
                       f"this model does not have one", field)


def _structured(service: ModelService, asked: StructuredOutputs, openers: list[int]) -> Grammar:
    assert service.grammar_vocabulary is not None
    vocabulary = service.grammar_vocabulary.get()
    if asked.json_ is not None:
        return Grammar.json_schema(vocabulary, asked.json_, openers)
    if asked.regex is not None:
        return Grammar.regex(vocabulary, asked.regex, openers)
    if asked.choice is not None:
        return Grammar.choice(vocabulary, asked.choice, openers)
    assert asked.grammar is not None
    return Grammar.lark(vocabulary, asked.grammar, openers)


def _tool_grammar(service: ModelService, calls: ToolCallDecoder, required: bool,
                  openers: list[int]) -> Grammar | None:
    assert service.grammar_vocabulary is not None
    calls_only = calls.only is not None or required
    open_token = service.single_token(TOOL_CALL_OPEN)
    if open_token is None and not calls_only:
        return None  # no token marks where a call begins
    lark = tool_call_lark(calls.tools, only=calls.only, parallel=calls.parallel, calls_only=calls_only,
                          special_markers=open_token is not None)
    if not calls_only:
        assert open_token is not None
        openers.append(open_token)
    return Grammar.lark(service.grammar_vocabulary.get(), lark, openers)
