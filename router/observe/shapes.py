"""What of a request body the API defines, for capture redaction (router.observe.redact).

A :class:`Shape` says, for one JSON value, which strings are the API's (an enumeration's
values, the model) and, for an object the API defines, which key names are: the parameters
of OpenAI's chat, completions, embeddings and Responses requests and of vLLM's extensions,
the fields of messages, content parts, tools and tool calls, and JSON schema keywords. Every
other string and every other key name is the client's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal


@dataclass(frozen=True, slots=True)
class Shape:
    """How one JSON value of a request body is redacted; the default: the client's own data."""

    words: frozenset[str] = frozenset()
    """Strings kept as they are (an enumeration's values)."""
    string: Literal["text", "name", "ref", "keep"] = "text"
    """Any other string: ``text`` is the client's; ``name`` too, but an identifier the API
    requires (``drop`` leaves it empty, not absent); ``ref`` a JSON schema ``$ref`` (its
    local name hashed like the ``$defs`` key it names); ``keep`` is kept (the model)."""
    fields: Mapping[str, Shape] | None = None
    """An object of this known shape: these key names kept, their values by these shapes;
    any other key is the client's (its name redacted, its value by ``values``). None: an
    object whose key names are all the client's (a map)."""
    values: Shape | None = None
    """Values of the keys ``fields`` does not name, or of a map; None: the client's data."""
    items: Shape | None = None
    """Elements of a list; None: this same shape (so ``stop: "x"`` and ``stop: ["x"]``)."""
    digit_keys: bool = False
    """A map whose all-digit keys are token ids (``logit_bias``): kept."""
    token_ids: bool = False
    """A list of integers is a prompt as token ids: keyed ids under ``hash``."""


FREE = Shape()
"""The client's data: its strings and key names redacted, numbers kept."""


def _obj(names: str = "", **fields: Shape) -> Shape:
    """An object of known shape: the space-separated ``names`` (values the client's data,
    numbers and booleans kept) and ``fields``."""
    return Shape(fields={**dict.fromkeys(names.split(), FREE), **fields})


def _enum(words: str, **fields: Shape) -> Shape:
    """Strings kept when one of the space-separated ``words`` (or an object of ``fields``)."""
    return Shape(words=frozenset(words.split()), fields=fields or None)


def _each(names: str, shape: Shape) -> dict[str, Shape]:
    """``shape`` for each of the space-separated ``names``."""
    return dict.fromkeys(names.split(), shape)


_NAME = Shape(string="name")
_EFFORT = _enum("none minimal low medium high")
# A JSON schema (tool parameters, structured output) nests schemas: its table is filled in
# once the shape that refers to it exists, and read-only after.
_schema_fields: dict[str, Shape] = {}
_SCHEMA = Shape(fields=MappingProxyType(_schema_fields))
_schema_fields.update(
    {
        "type": _enum("object array string number integer boolean null"),
        "format": _enum(
            "date-time date time duration email idn-email hostname idn-hostname ipv4 ipv6 uri"
            " uri-reference iri iri-reference uuid uri-template json-pointer"
            " relative-json-pointer regex"
        ),
        "$ref": Shape(string="ref"),
        # maps of the client's names to schemas
        **_each(
            "properties patternProperties $defs definitions dependentSchemas",
            Shape(values=_SCHEMA),
        ),
        # a schema, or a list of schemas
        **_each(
            "items prefixItems additionalItems additionalProperties unevaluatedItems"
            " unevaluatedProperties contains propertyNames not if then else anyOf oneOf allOf",
            _SCHEMA,
        ),
        # the other keywords: values the client's (a description, an enum, a pattern)
        **_each(
            "$schema $id $anchor $dynamicRef $dynamicAnchor $comment $vocabulary title"
            " description default examples enum const required dependentRequired minimum"
            " maximum exclusiveMinimum exclusiveMaximum multipleOf minLength maxLength pattern"
            " minItems maxItems uniqueItems minContains maxContains minProperties"
            " maxProperties contentEncoding contentMediaType contentSchema deprecated readOnly"
            " writeOnly nullable discriminator strict",
            FREE,
        ),
    }
)
_CONTENT = Shape(
    items=_obj(
        "text refusal annotations logprobs file_id file_data filename file_url",
        type=_enum(
            "text image_url input_audio file video_url audio_url refusal input_text"
            " output_text input_image input_file image audio video"
        ),
        image_url=_obj("url", detail=_enum("auto low high")),
        detail=_enum("auto low high"),
        input_audio=_obj("data", format=_enum("wav mp3")),
        video_url=_obj("url"),
        audio_url=_obj("url"),
        file=_obj("file_data file_id filename"),
        cache_control=_obj("ttl", type=_enum("ephemeral")),
    )
)  # a string, or a list of parts
_FUNCTION = _obj("description strict", name=_NAME, parameters=_SCHEMA)
# A tool: Chat Completions' nest a function; the Responses API's are flat.
_TOOL = Shape(fields={**(_FUNCTION.fields or {}), "type": _enum("function"), "function": _FUNCTION})
_MESSAGE = _obj(
    "name tool_call_id refusal audio reasoning_content reasoning",
    role=_enum("system developer user assistant tool function"),
    content=_CONTENT,
    tool_calls=Shape(
        items=_obj("id index", type=_enum("function"), function=_obj("arguments", name=_NAME))
    ),
    function_call=_obj("arguments", name=_NAME),
)
_PROMPT = Shape(token_ids=True)  # text, token ids, or a list of either
# An embeddings prompt, or the Responses API's input: text, or a list of items (messages,
# function calls and their outputs).
_INPUT = Shape(
    token_ids=True,
    fields={
        **(_MESSAGE.fields or {}),
        **_each("id status call_id output arguments summary encrypted_content", FREE),
        "type": _enum("message function_call function_call_output reasoning"),
    },
)
_FORMAT = _obj(
    "description strict",
    type=_enum("text json_object json_schema regex structural_tag"),
    name=_NAME,
    json_schema=_obj("description strict", name=_NAME, schema=_SCHEMA),
    schema=_SCHEMA,
)
BODY = _obj(
    # OpenAI's parameters (chat, completions, embeddings, the Responses API) whose values are
    # numbers, booleans, ids or the client's text
    "frequency_penalty presence_penalty logprobs top_logprobs max_tokens"
    " max_completion_tokens max_output_tokens n seed stop stream temperature top_p user"
    " parallel_tool_calls metadata store audio prompt_cache_key prompt_cache_retention"
    " safety_identifier verbosity web_search_options best_of echo suffix dimensions"
    " instructions previous_response_id include background conversation max_tool_calls"
    " truncation"
    # vLLM's: sampling, output, chat template and multimodal options
    " use_beam_search top_k min_p repetition_penalty length_penalty stop_token_ids"
    " include_stop_str_in_output ignore_eos min_tokens skip_special_tokens"
    " spaces_between_special_tokens truncate_prompt_tokens prompt_logprobs allowed_token_ids"
    " bad_words logits_processors return_tokens_as_token_ids return_token_ids cache_salt"
    " kv_transfer_params vllm_xargs priority request_id add_generation_prompt"
    " continue_final_message add_special_tokens chat_template mm_processor_kwargs"
    " guided_regex guided_choice guided_grammar guided_decoding_backend"
    " guided_whitespace_pattern structural_tag normalize",
    model=Shape(string="keep"),
    messages=Shape(items=_MESSAGE),
    prompt=_PROMPT,
    input=_INPUT,
    system=_CONTENT,
    prediction=_obj(type=_enum("content"), content=_CONTENT),
    tools=Shape(items=_TOOL),
    functions=Shape(items=_FUNCTION),
    # a word, or the one function to call
    tool_choice=_enum(
        "none auto required", type=_enum("function"), name=_NAME, function=_obj(name=_NAME)
    ),
    function_call=_enum("none auto", name=_NAME),
    response_format=_FORMAT,
    text=_obj(format=_FORMAT, verbosity=_enum("low medium high")),
    reasoning=_obj(effort=_EFFORT, summary=_enum("auto concise detailed")),
    guided_json=_SCHEMA,
    structured_outputs=_obj(
        "regex choice grammar json_object structural_tag whitespace_pattern"
        " disable_any_whitespace disable_additional_properties",
        json=_SCHEMA,
    ),
    stream_options=_obj("include_usage continuous_usage_stats include_obfuscation"),
    logit_bias=Shape(digit_keys=True),
    documents=Shape(items=_obj("title text")),
    # the keys chat templates read (Qwen3's, DeepSeek's, gpt-oss's); any other is the client's
    chat_template_kwargs=_obj("enable_thinking thinking", reasoning_effort=_EFFORT),
    reasoning_effort=_EFFORT,
    service_tier=_enum("auto default flex scale priority"),
    modalities=_enum("text audio"),
    encoding_format=_enum("float base64"),
)
