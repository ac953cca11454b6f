"""`cbserve complete "prompt"`: one text completion, printed as it streams."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import httpx

from cbserve.openai_http import ApiError, default_model, make_client, post_json, stream_chunks


@dataclass
class CompleteOptions:
    prompt: str
    base_url: str
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    stream: bool = True


def request_body(opts: CompleteOptions, model: str) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "prompt": opts.prompt}
    # Unset options are left out, so the server's defaults apply rather than ours.
    if opts.max_tokens is not None:
        body["max_tokens"] = opts.max_tokens
    if opts.temperature is not None:
        body["temperature"] = opts.temperature
    return body


def run_complete(opts: CompleteOptions) -> int:
    """Print the completion's text followed by one newline; errors go to stderr with exit code 1."""
    try:
        with make_client(opts.base_url) as client:
            body = request_body(opts, opts.model or default_model(client))
            if opts.stream:
                for chunk in stream_chunks(client, "/v1/completions", body):
                    for choice in chunk.get("choices", []):
                        sys.stdout.write(choice.get("text") or "")
                    sys.stdout.flush()
            else:
                sys.stdout.write(post_json(client, "/v1/completions", body)["choices"][0]["text"])
    except ApiError as exc:
        print(f"\ncbserve complete: {exc}", file=sys.stderr)
        return 1
    except httpx.HTTPError as exc:
        print(
            f"\ncbserve complete: cannot reach {opts.base_url} ({exc}); is `cbserve up` running?",
            file=sys.stderr,
        )
        return 1
    sys.stdout.write("\n")
    sys.stdout.flush()
    return 0
