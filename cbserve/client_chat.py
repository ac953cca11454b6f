"""`cbserve chat`: a multi-turn chat in the terminal, streamed from the gateway's public HTTP API.

With a terminal on stdin it prompts and labels replies; with stdin piped it reads one user turn per
line and prints each reply on its own line, nothing else, so scripts and tests can read it.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from typing import Any, TextIO

import httpx

from cbserve.openai_http import ApiError, default_model, make_client, stream_chunks

EXIT_COMMANDS = ("/exit", "/quit")
RESET_COMMAND = "/reset"
HELP = "Type a message and press Enter; /reset forgets the conversation, /exit or Ctrl-D quits."


@dataclass
class ChatOptions:
    base_url: str
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    system: str | None = None


def initial_messages(system: str | None) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}] if system else []


def request_body(opts: ChatOptions, model: str, messages: list[dict[str, str]]) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "messages": messages}
    if opts.max_tokens is not None:
        body["max_tokens"] = opts.max_tokens
    if opts.temperature is not None:
        body["temperature"] = opts.temperature
    return body


def _read_turn(interactive: bool, stdin: TextIO) -> str | None:
    """The next user line, or None at end of input."""
    if interactive:
        try:
            return input("you> ")
        except EOFError:
            print()
            return None
    line = stdin.readline()
    return line.rstrip("\n") if line else None


def stream_reply(client: httpx.Client, body: dict[str, Any], out: TextIO) -> str:
    """Write the reply's text as it arrives and return all of it."""
    parts: list[str] = []
    for chunk in stream_chunks(client, "/v1/chat/completions", body):
        for choice in chunk.get("choices", []):
            text = (choice.get("delta") or {}).get("content") or ""
            if text:
                parts.append(text)
                out.write(text)
                out.flush()
    return "".join(parts)


def run_chat(opts: ChatOptions, stdin: TextIO = sys.stdin, out: TextIO = sys.stdout) -> int:
    """Chat until EOF or /exit. Exit code 1 if the server could not be reached or any turn failed."""
    interactive = stdin.isatty()
    if interactive:
        with contextlib.suppress(ImportError):  # not on every platform
            import readline  # noqa: F401 - imported for its side effect: line editing and history in input()
    failed = False
    with make_client(opts.base_url) as client:
        try:
            model = opts.model or default_model(client)
        except (ApiError, httpx.HTTPError) as exc:
            print(
                f"cbserve chat: cannot use {opts.base_url} ({exc}); is `cbserve up` running?", file=sys.stderr
            )
            return 1
        if interactive:
            print(f"Chatting with {model} at {opts.base_url}. {HELP}")
        messages = initial_messages(opts.system)
        while (line := _read_turn(interactive, stdin)) is not None:
            text = line.strip()
            if not text:
                continue
            if text in EXIT_COMMANDS:
                break
            if text == RESET_COMMAND:
                messages = initial_messages(opts.system)
                continue
            turn = [*messages, {"role": "user", "content": line}]
            if interactive:
                out.write("assistant> ")
            try:
                reply = stream_reply(client, request_body(opts, model, turn), out)
            except KeyboardInterrupt:  # stop this reply, keep chatting; the turn is not kept
                out.write(" [interrupted]\n")
                continue
            except (ApiError, httpx.HTTPError) as exc:
                out.write("\n")
                print(f"cbserve chat: {exc}", file=sys.stderr)
                failed = True
                continue
            out.write("\n")
            out.flush()
            # Only a turn that completed becomes history, so a failed one can simply be retried.
            messages = [*turn, {"role": "assistant", "content": reply}]
    return 1 if failed else 0
