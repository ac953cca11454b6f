"""`cbserve up | chat | complete`: start the whole stack in one command, or talk to a running one."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from cbserve.defaults import (
    DEFAULT_BASE_URL,
    DEFAULT_COMPLETE_MAX_TOKENS,
    DEFAULT_MAX_RESTARTS,
    DEFAULT_MODEL_DIR,
    DEFAULT_READY_TIMEOUT_S,
    DEFAULT_RESTART_WINDOW_S,
    REDIS_MODES,
)

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")


def _positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {number}")
    return number


def _add_sampling_args(parser: argparse.ArgumentParser, max_tokens: int | None = None) -> None:
    parser.add_argument(
        "--base-url",
        default=os.environ.get("CBSERVE_URL") or DEFAULT_BASE_URL,
        help=f"gateway URL (default: $CBSERVE_URL, else {DEFAULT_BASE_URL})",
    )
    parser.add_argument("--model", help="model name (default: the first one GET /v1/models lists)")
    shown = "the server's" if max_tokens is None else str(max_tokens)
    parser.add_argument(
        "--max-tokens", type=_positive_int, default=max_tokens, help=f"tokens per reply (default: {shown})"
    )
    parser.add_argument("--temperature", type=float, help="0 is greedy (default: the server's, 1.0)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cbserve", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True, metavar="{up,chat,complete}")

    up = commands.add_parser("up", help="start Redis (if needed), the batcher, workers and the gateway")
    up.add_argument(
        "--model",
        action="append",
        help=f"model directory or hub id (default: $MODEL, else {DEFAULT_MODEL_DIR}); given again, each "
        "model is served by cells of its own, all behind the one gateway (a request names its `model`)",
    )
    up.add_argument(
        "--models-config",
        type=Path,
        help="several models from a JSON (or YAML) file listing each one's directory, served name and "
        "cells (docs/settings.md, GATEWAY_MODELS_CONFIG), instead of --model",
    )
    up.add_argument(
        "--lora-modules",
        nargs="+",
        metavar="NAME=PATH",
        help="LoRA adapters served from the start, vLLM's form: name=path, or JSON "
        '\'{"name": ..., "path": ..., "base_model_name": ...}\' (GATEWAY_LORA_MODULES)',
    )
    up.add_argument("--workers", type=_positive_int, default=1, help="worker processes per cell (default 1)")
    up.add_argument(
        "--cells",
        type=_positive_int,
        default=1,
        help="cells cell0, cell1, ...: a batcher and --workers workers each, on the one Redis; the gateway "
        "places each request in the least loaded (default 1: no cell name changes)",
    )
    up.add_argument(
        "--gateways",
        "--api-server-count",
        type=_positive_int,
        default=1,
        help="gateway processes, all on --port (vLLM's --api-server-count): the front end's Python "
        "then runs on as many cores (default 1)",
    )
    up.add_argument("--host", default="127.0.0.1", help="gateway bind address (default 127.0.0.1)")
    up.add_argument("--port", type=int, default=8000, help="gateway port (default 8000)")
    up.add_argument(
        "--redis",
        choices=REDIS_MODES,
        default="auto",
        help="auto: a reachable $REDIS_URL, else redis-server from PATH, else the embedded one; "
        "url / binary / embedded force one (default auto)",
    )
    up.add_argument(
        "--device",
        choices=["auto", "cpu", "cuda"],
        default="auto",
        help="worker device (default auto: cuda when torch sees one, else cpu)",
    )
    up.add_argument(
        "--celery",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="start a Celery worker for the Batch API and the cbserve.generate task, when celery is "
        "installed (default on; --no-celery turns it off)",
    )
    up.add_argument(
        "--max-restarts",
        type=int,
        default=DEFAULT_MAX_RESTARTS,
        help="a service that dies is started again, up to this many times within "
        f"{DEFAULT_RESTART_WINDOW_S:g} s; then everything stops (default {DEFAULT_MAX_RESTARTS}; "
        "0: stop at the first death)",
    )
    up.add_argument(
        "--run-dir",
        type=Path,
        help="logs and Redis data (default ./.cbserve/runs/<time>-<pid>); given, it also keeps what the next "
        "run reuses (Redis' port and password, the env file), which ./.cbserve keeps otherwise",
    )
    up.add_argument(
        "--speculative-config",
        help="speculative decoding for every service, as SPECULATIVE_CONFIG: vLLM's JSON, e.g. "
        '\'{"method": "ngram", "num_speculative_tokens": 4}\' (default: $SPECULATIVE_CONFIG, else off)',
    )
    up.add_argument(
        "--runner",
        choices=["auto", "generate", "pooling"],
        help="vLLM's --runner for every worker: pooling serves embeddings, classification and scores "
        "instead of generating (default auto: from the model's files; WORKER_RUNNER)",
    )
    up.add_argument(
        "--convert",
        choices=["auto", "embed", "classify"],
        help="vLLM's --convert: embed serves a chat model's own last-token hidden states (normalized) "
        "as an embedding model, classify its classifier head; implies --runner pooling (WORKER_CONVERT)",
    )
    up.add_argument(
        "--ready-timeout",
        dest="ready_timeout_s",
        metavar="READY_TIMEOUT",
        type=float,
        default=DEFAULT_READY_TIMEOUT_S,
        help=f"seconds to wait for the stack to be ready (default {DEFAULT_READY_TIMEOUT_S:g})",
    )

    chat = commands.add_parser("chat", help="multi-turn chat in the terminal (reads stdin lines when piped)")
    _add_sampling_args(chat)
    chat.add_argument("--system", help="system message that opens the conversation")

    complete = commands.add_parser("complete", help="one text completion, printed as it streams")
    complete.add_argument("prompt")
    _add_sampling_args(complete, max_tokens=DEFAULT_COMPLETE_MAX_TOKENS)
    complete.add_argument(
        "--stream", action=argparse.BooleanOptionalAction, default=True, help="stream tokens (default on)"
    )
    return parser


def _options(cls: type[T], args: argparse.Namespace) -> T:
    """A command's options dataclass, each field from the parsed argument of the same name."""
    return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Each command imports only what it needs: the clients never load the launcher's machinery.
    try:
        if args.command == "up":
            from cbserve.launcher import UpOptions, run_up

            return run_up(_options(UpOptions, args))
        if args.command == "chat":
            from cbserve.client_chat import ChatOptions, run_chat

            return run_chat(_options(ChatOptions, args))
        from cbserve.client_complete import CompleteOptions, run_complete

        return run_complete(_options(CompleteOptions, args))
    except KeyboardInterrupt:  # the clients' Ctrl-C; `up` handles its own signals
        print(file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
