"""The strings of a request body: valid Unicode always, and a length cap on each one a client names or
identifies something with, so that none is stored, logged or quoted back at whatever size the body
limit lets through.

The caps are OpenAI's where it documents one: 64 characters for a name (of a function, a json_schema,
a message's participant), and, checked where they are used, 16 metadata pairs of 64 / 512 characters,
256 for `user`, 256 per stop string. Text is not capped here: message content, prompts, instructions,
tool-call arguments and reasoning are bounded by the prompt-length check and the body limit, and so
is what the model wrote that a client sends back (a tool call's name): it goes into the prompt again,
and a cap below what the model may write would refuse the server's own output.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, Field

from openai_frontend.protocol.errors import too_long

MAX_NAME_CHARS = 64  # OpenAI's, for function, json_schema and participant names
# Ids and keys a client makes up or sends back: a model name, call ids, response and file ids, cache
# keys, a batch line's custom_id. Ours are 29 to 70 characters; clients' uuids and prefixed ids fit.
MAX_ID_CHARS = 256
MAX_WORD_CHARS = 64  # a value of a fixed set (role, type, tier, ...), or a token id as a key
# A tool's or json_schema's description. OpenAI's chat API refuses function descriptions past 1,024,
# which agent clients (MCP servers, coding agents) exceed by far; the prompt bounds them too.
MAX_DESCRIPTION_CHARS = 32 * 1024
MAX_FILENAME_CHARS = 255  # what a file system allows one name


def _valid_unicode(text: str) -> str:
    # JSON can spell lone UTF-16 surrogates ("\ud83d"); they cannot be encoded, tokenized or stored.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"not valid Unicode (a lone surrogate at character {exc.start})") from None
    return text


Text = Annotated[str, AfterValidator(_valid_unicode)]
JSONObject = dict[Text, Any]
# The cap before the Unicode check: on the str itself, so that pydantic reports `string_too_long`.
Name = Annotated[str, Field(max_length=MAX_NAME_CHARS), AfterValidator(_valid_unicode)]
Id = Annotated[str, Field(max_length=MAX_ID_CHARS), AfterValidator(_valid_unicode)]
Word = Annotated[str, Field(max_length=MAX_WORD_CHARS), AfterValidator(_valid_unicode)]
Description = Annotated[str, Field(max_length=MAX_DESCRIPTION_CHARS), AfterValidator(_valid_unicode)]


def check_length(value: str, limit: int, param: str) -> str:
    """`value`, or a 400 naming `param` when it is longer than `limit`: for strings inside a JSON
    object the schema does not type (tools, tool calls) and for form fields."""
    if len(value) > limit:
        raise too_long(param, limit, len(value))
    return value
