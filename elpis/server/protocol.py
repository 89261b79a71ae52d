"""Request bodies of the OpenAI-compatible endpoints, validated with pydantic.

Unknown fields are refused with 400 naming the field. Two kinds of fields that clients send routinely are
accepted without effect, and are listed here so the behaviour is documented in one place:

- `IGNORED_FIELDS`: bookkeeping with no effect on the answer (`user`, `metadata`, `store`,
  `service_tier`, `safety_identifier`, `prompt_cache_key`); accepted with any value.
- neutral-only fields: `n` (only 1), `skip_special_tokens` (only true), `modalities` (only ["text"]), and on
  completions `best_of` (only 1), `echo` (only false) and `suffix` (only null or ""). Any other value is
  refused, because honouring it would change the output.

The penalties (`frequency_penalty`, `presence_penalty`, `repetition_penalty`) and `logit_bias` are honoured
(`elpis.spec.penalties`), within the ranges below.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from elpis.server.errors import APIError, bad_request
from elpis.server.schema_values import strict_json_loads
from elpis.spec.sampling import MAX_LOGIT_BIAS, MAX_PENALTY

IGNORED_FIELDS = frozenset(
    {"user", "metadata", "store", "service_tier", "safety_identifier", "prompt_cache_key"}
)
ModelT = TypeVar("ModelT", bound=BaseModel)
MAX_STOP_STRINGS = 16
MAX_STOP_IDS = 16
MAX_TOP_LOGPROBS = 20
MAX_LOGIT_BIAS_ENTRIES = 300  # OpenAI's limit
TOOL_NAME_PATTERN = r"^[A-Za-z0-9_.\-]{1,64}$"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


def _neutral(value: Any, expected: Any, field: str, why: str) -> Any:
    if value is not None and value != expected:
        raise ValueError(f"{field} must be {json.dumps(expected)} ({why})")
    return value


# ---------------------------------------------------------------------------------------------- messages


class TextPart(Strict):
    type: Literal["text"]
    text: str

    @model_validator(mode="before")
    @classmethod
    def _text_only(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("type") != "text":
            raise ValueError(f"only text content parts are supported, not {str(data.get('type'))[:40]!r}")
        return data


Content = str | list[TextPart]


def content_text(content: Content | None) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.text for part in content)


class FunctionCall(Strict):
    name: str = Field(min_length=1)
    arguments: str


class ToolCallIn(Strict):
    id: str = Field(min_length=1)
    type: Literal["function"] = "function"
    function: FunctionCall
    index: int | None = None  # some clients echo the streamed index back


class SystemMessage(Strict):
    role: Literal["system", "developer"]  # "developer" is OpenAI's newer name for the system role
    content: Content
    name: str | None = None


class UserMessage(Strict):
    role: Literal["user"]
    content: Content
    name: str | None = None


class AssistantMessage(Strict):
    role: Literal["assistant"]
    content: Content | None = None
    tool_calls: list[ToolCallIn] | None = None
    reasoning_content: str | None = None
    name: str | None = None
    refusal: str | None = None

    @model_validator(mode="after")
    def _content_or_calls(self) -> AssistantMessage:
        if self.content is None and not self.tool_calls:
            raise ValueError("an assistant message needs content or tool_calls")
        return self


class ToolMessage(Strict):
    role: Literal["tool"]
    content: Content
    tool_call_id: str = Field(min_length=1)
    name: str | None = None


Message = Annotated[SystemMessage | UserMessage | AssistantMessage | ToolMessage, Field(discriminator="role")]


# ------------------------------------------------------------------------------------------------- tools


class FunctionDef(Strict):
    name: str = Field(pattern=TOOL_NAME_PATTERN)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # accepted; there is no grammar to enforce it yet

    @field_validator("parameters")
    @classmethod
    def _object_schema(cls, schema: dict[str, Any] | None) -> dict[str, Any] | None:
        if schema is not None and schema and schema.get("type", "object") != "object":
            raise ValueError('the parameters schema must have "type": "object"')
        return schema


class ToolDef(Strict):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(Strict):
    name: str


class NamedToolChoice(Strict):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["auto", "none", "required"] | NamedToolChoice


# ---------------------------------------------------------------------------------------- other objects


class StreamOptions(Strict):
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None  # sent by vLLM clients; usage comes once, at the end


class JsonSchemaFormat(Strict):
    """OpenAI's `response_format.json_schema`. The schema is always enforced; `strict` decides whether a
    keyword the grammar engine does not implement (uniqueItems, contains, ...) is refused (strict) or
    ignored."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    json_schema: dict[str, Any] = Field(alias="schema")
    description: str | None = None
    strict: bool | None = None


class ResponseFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_matches_type(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("json_schema is required with type json_schema, and only with it")
        return self

    def answer_schema(self) -> dict[str, Any] | None:
        """The JSON schema the answer must follow (json_object: any object); None for text."""
        if self.type == "text":
            return None
        return {"type": "object"} if self.json_schema is None else self.json_schema.json_schema


class StructuredOutputs(Strict):
    """vLLM's `structured_outputs` (chat and completions): exactly one of a JSON schema (an object, or its
    JSON text), a regular expression, a list of choices, or a Lark grammar (llguidance's dialect)."""

    json_: dict[str, Any] | None = Field(default=None, alias="json")
    regex: str | None = Field(default=None, min_length=1)
    choice: list[Annotated[str, Field(min_length=1)]] | None = Field(
        default=None, min_length=1, max_length=1024
    )
    grammar: str | None = Field(default=None, min_length=1)

    @field_validator("json_", mode="before")
    @classmethod
    def _schema_text(cls, value: Any) -> Any:
        """A schema sent as JSON text is read here; an object stays as it is."""
        if not isinstance(value, str):
            return value
        try:
            schema = strict_json_loads(value)
        except (ValueError, RecursionError) as exc:
            raise ValueError(f"json is not valid JSON: {exc}") from None
        if not isinstance(schema, dict):
            raise ValueError("json must be a JSON schema object")
        return schema

    @model_validator(mode="after")
    def _exactly_one(self) -> StructuredOutputs:
        given = [name for name in ("json_", "regex", "choice", "grammar") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of json, regex, choice and grammar")
        return self


class ChatTemplateKwargs(Strict):
    enable_thinking: bool | None = None
    reasoning_effort: Literal["xhigh", "medium", "low"] | None = None
    preserve_thinking: bool | None = None


# ----------------------------------------------------------------------------------------------- requests


class SamplingFields(Strict):
    """Fields shared by chat and completions."""

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    seed: int | None = None
    stop: str | list[str | int] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    structured_outputs: StructuredOutputs | None = None
    return_token_ids: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    frequency_penalty: float | None = Field(default=None, ge=-MAX_PENALTY, le=MAX_PENALTY)
    presence_penalty: float | None = Field(default=None, ge=-MAX_PENALTY, le=MAX_PENALTY)
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=MAX_PENALTY)
    logit_bias: dict[str, float] | None = None  # token id (a decimal string) -> bias
    # neutral-only (see the module docstring)
    n: int | None = None
    skip_special_tokens: bool | None = None
    modalities: list[str] | None = None

    @field_validator("n")
    @classmethod
    def _n(cls, v: int | None) -> int | None:
        return _neutral(v, 1, "n", "one choice per request")

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        if not v:
            return v
        if len(v) > MAX_LOGIT_BIAS_ENTRIES:
            raise ValueError(f"at most {MAX_LOGIT_BIAS_ENTRIES} logit_bias entries, got {len(v)}")
        ids: set[int] = set()
        for key, bias in v.items():
            if not (key.isascii() and key.isdigit()):
                raise ValueError(f"logit_bias keys are token ids as decimal strings, got {key[:40]!r}")
            if not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
                raise ValueError(f"logit_bias values must be in [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}], "
                                 f"got {bias!r} for token {key}")
            if int(key) in ids:
                raise ValueError(f"logit_bias names token {int(key)} twice")
            ids.add(int(key))
        return v

    def bias_pairs(self) -> tuple[tuple[int, float], ...]:
        """logit_bias as (token id, bias) pairs, by id."""
        return tuple(sorted((int(key), float(bias)) for key, bias in (self.logit_bias or {}).items()))

    @field_validator("skip_special_tokens")
    @classmethod
    def _skip(cls, v: bool | None) -> bool | None:
        return _neutral(v, True, "skip_special_tokens", "special tokens are always left out of text")

    @field_validator("modalities")
    @classmethod
    def _modalities(cls, v: list[str] | None) -> list[str] | None:
        return _neutral(v, ["text"], "modalities", "text only")

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: str | list[str | int] | None) -> str | list[str | int] | None:
        items = [v] if isinstance(v, str) else (v or [])
        strings = [item for item in items if isinstance(item, str)]
        ids = [item for item in items if isinstance(item, int)]
        if any(not s for s in strings):
            raise ValueError("stop strings must not be empty")
        if len(strings) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings")
        if any(i < 0 for i in ids) or len(ids) > MAX_STOP_IDS:
            raise ValueError(f"stop ids must be >= 0, at most {MAX_STOP_IDS}")
        return v

    @field_validator("stop_token_ids")
    @classmethod
    def _stop_ids(cls, v: list[int] | None) -> list[int] | None:
        if v and (any(i < 0 for i in v) or len(v) > MAX_STOP_IDS):
            raise ValueError(f"stop_token_ids must be >= 0, at most {MAX_STOP_IDS}")
        return v

    def check(self) -> None:
        """Rules across fields (after pydantic has checked each field on its own)."""
        if self.stream_options is not None and not self.stream:
            raise bad_request("stream_options requires stream: true", "stream_options")

    def stop_strings(self) -> tuple[str, ...]:
        items = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        return tuple(dict.fromkeys(item for item in items if isinstance(item, str)))

    def listed_stop_ids(self) -> list[int]:
        """The token ids among `stop` (which also takes strings)."""
        return [] if isinstance(self.stop, str) else [i for i in self.stop or [] if isinstance(i, int)]

    def stop_ids(self) -> tuple[int, ...]:
        return tuple(dict.fromkeys(self.listed_stop_ids() + list(self.stop_token_ids or [])))

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatRequest(SamplingFields):
    messages: list[Message] = Field(min_length=1)
    tools: list[ToolDef] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    response_format: ResponseFormat | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    chat_template_kwargs: ChatTemplateKwargs | None = None
    # reasoning tokens at most before the server closes the block (elpis.server.thinking; moot without it)
    thinking_token_budget: int | None = Field(default=None, ge=0)

    def check(self) -> None:
        super().check()
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            raise bad_request("send max_tokens or max_completion_tokens, not both", "max_completion_tokens")
        if self.top_logprobs is not None and not self.logprobs:
            raise bad_request("top_logprobs requires logprobs: true", "top_logprobs")
        names = [tool.function.name for tool in self.tools or []]
        if len(set(names)) != len(names):
            raise bad_request("tool names must be unique", "tools")
        choice = self.tool_choice
        if choice not in (None, "none") and not names:
            raise bad_request("tool_choice other than none needs tools", "tool_choice")
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise bad_request(
                f"tool_choice names {choice.function.name!r}, which is not among the tools", "tool_choice"
            )
        if self.structured_outputs is not None and (
            (self.response_format is not None and self.response_format.type != "text") or self.tools_enabled()
        ):
            raise bad_request(
                "structured_outputs cannot be combined with a response_format other than text or with tools "
                "unless tool_choice is none",
                "structured_outputs",
            )
        if self.response_format is not None and self.response_format.type != "text" and self.tools_enabled():
            # The answer's grammar would leave no room for a tool call.
            raise bad_request(
                "response_format json_object or json_schema cannot be combined with tools unless tool_choice "
                "is none",
                "response_format",
            )

    def output_budget(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def tools_enabled(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"


# text, ids, or a list holding one of them (some clients always send a list); a batch is refused
CompletionPrompt = str | list[int] | list[str] | list[list[int]]


class CompletionRequest(SamplingFields):
    prompt: CompletionPrompt
    logprobs: int | None = Field(default=None, ge=0, le=5)
    best_of: int | None = None
    echo: bool | None = None
    suffix: str | None = None

    @field_validator("best_of")
    @classmethod
    def _best_of(cls, v: int | None) -> int | None:
        return _neutral(v, 1, "best_of", "one candidate per request")

    @field_validator("echo")
    @classmethod
    def _echo(cls, v: bool | None) -> bool | None:
        return _neutral(v, False, "echo", "the prompt is not echoed")

    @field_validator("suffix")
    @classmethod
    def _suffix(cls, v: str | None) -> str | None:
        if v:
            raise ValueError("suffix is not supported")
        return v

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v: CompletionPrompt) -> CompletionPrompt:
        if isinstance(v, list) and v and isinstance(v[0], list | str):
            if len(v) != 1:
                raise ValueError(
                    f"one prompt per request: got a batch of {len(v)} prompts; send each as its own request"
                )
            if isinstance(v[0], str):
                v = v[0]  # ["text"], as some clients send a single prompt
        if isinstance(v, str) and not v:
            raise ValueError("the prompt is empty")
        if isinstance(v, list) and (not v or (isinstance(v[0], list) and not v[0])):
            raise ValueError("the prompt is empty")
        return v

    def prompt_ids(self) -> list[int] | None:
        if isinstance(self.prompt, str):
            return None
        ids = self.prompt[0] if self.prompt and isinstance(self.prompt[0], list) else self.prompt
        return list(ids)  # type: ignore[arg-type]


class RenderRequest(ChatRequest):
    """`/v1/chat/completions/render`: the chat body; nothing is generated."""

    def check(self) -> None:
        super().check()
        if self.stream:
            raise bad_request("render does not stream", "stream")


class TokenizeRequest(Strict):
    model: str | None = None
    prompt: str | None = None
    messages: list[Message] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    tools: list[ToolDef] | None = None
    chat_template_kwargs: ChatTemplateKwargs | None = None
    return_token_strs: bool = False

    def check(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise bad_request("send exactly one of prompt and messages", "prompt")


class DetokenizeRequest(Strict):
    model: str | None = None
    tokens: list[int]


# ------------------------------------------------------------------------------------------------ parsing


def parse_json_body(raw: bytes) -> dict[str, Any]:
    try:
        body = strict_json_loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise bad_request("the request body is not UTF-8") from None
    except (ValueError, RecursionError) as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    return body


def _location(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not out:
            out = str(part)
        else:
            out += f".{part}"
    return out


# Tags of discriminated unions, which pydantic puts into `loc` after an item's index: chat's roles, the
# Responses API's input item types (responses_request.py) and the Messages API's block types
# (messages_request.py). They are not fields.
_TAGS = {"system", "developer", "user", "assistant", "tool",
         "message", "function_call", "function_call_output", "reasoning", "unsupported",
         "anthropic_text", "anthropic_tool_use", "anthropic_tool_result", "anthropic_thinking",
         "anthropic_redacted_thinking", "anthropic_unsupported"}
_TYPE_TAGS = {"str", "int", "bool", "float", "dict", "list"}


def _clean_loc(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    # pydantic puts union branches ("str", "list[...]") and discriminator tags ("assistant") into `loc`
    kept: list[Any] = []
    for part in loc:
        if isinstance(part, str) and ("[" in part or part in _TYPE_TAGS):
            continue
        if isinstance(part, str) and part in _TAGS and kept and isinstance(kept[-1], int):
            continue
        kept.append(part)
    return tuple(kept)


def validate_request(
    model: type[ModelT], body: dict[str, Any], ignored: frozenset[str] = IGNORED_FIELDS
) -> ModelT:
    """Validate a decoded body; any problem is an APIError(400) naming the field. Fields in `ignored` are
    dropped unread."""
    fields = {key: value for key, value in body.items() if key not in ignored}
    try:
        request = model.model_validate(fields)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        for error in errors:  # an unknown field is the most useful thing to report
            if error["type"] == "extra_forbidden":
                name = _location(_clean_loc(tuple(error["loc"])))
                raise bad_request(f"Unsupported field: {name}", param=name) from None
        # the deepest error is the most specific (a failed union reports every branch)
        error = max(errors, key=lambda e: len(_clean_loc(tuple(e["loc"]))))
        name = _location(_clean_loc(tuple(error["loc"])))
        message = str(error["msg"]).removeprefix("Value error, ")
        raise bad_request(f"{name}: {message}" if name else message, param=name or None) from None
    except (RecursionError, ValueError, TypeError) as exc:  # pragma: no cover - pydantic reports these
        raise APIError(400, f"invalid request: {exc}") from None
    check = getattr(request, "check", None)
    if check is not None:
        check()
    return request
