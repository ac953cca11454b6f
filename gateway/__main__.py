"""`python -m gateway --host H --port P [--model DIR] [--served-model-name NAME] [--reuse-port]`,
or `--models-config FILE` for several models, and `--lora-modules NAME=PATH ...` for LoRA adapters.

`--reuse-port`: several gateway processes listen on one port (SO_REUSEPORT; the kernel deals the
connections out), as `cbserve up --gateways N` runs them (vLLM's `--api-server-count`).

`python -m gateway hash-key [--name NAME] [--generate]` prints the config line for an API key.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
from typing import Any

import uvicorn

from common.gc_tuning import tune_gc
from common.logging_setup import configure_logging
from gateway.app import create_app
from gateway.security import key_cli
from gateway.security.connection_guard import uvicorn_options
from gateway.settings import GatewaySettings


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m gateway", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--model", help="model directory (overrides GATEWAY_MODEL / MODEL)")
    parser.add_argument("--served-model-name", help="name clients pass as `model` (default: directory name)")
    parser.add_argument(
        "--models-config", help="several models: a JSON or YAML file (overrides GATEWAY_MODELS_CONFIG)"
    )
    parser.add_argument(
        "--lora-modules",
        nargs="+",
        metavar="NAME=PATH",
        help="LoRA adapters served from the start: name=path or vLLM's JSON form (GATEWAY_LORA_MODULES)",
    )
    parser.add_argument("--log-level", default="info")
    parser.add_argument(
        "--reuse-port", action="store_true", help="share the port with other gateway processes (SO_REUSEPORT)"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["hash-key"]:
        raise SystemExit(key_cli.main(argv[1:]))
    args = parse_args(argv)
    # Flags given on the command line win over the environment.
    overrides: dict[str, Any] = {}
    if args.model is not None:
        overrides["model"] = args.model
    if args.served_model_name is not None:
        overrides["served_model_name"] = args.served_model_name
    if args.models_config is not None:
        overrides["models_config"] = args.models_config
    if args.lora_modules is not None:
        overrides["lora_modules"] = json.dumps(args.lora_modules)
    settings = GatewaySettings(**overrides)
    configure_logging("gateway", settings.log_format, args.log_level)
    # Open streams get a few seconds to finish on shutdown rather than holding it up indefinitely.
    config = uvicorn.Config(
        create_app(settings),
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        log_config=None,  # uvicorn's records go through the root handler: one format for every line
        timeout_graceful_shutdown=5,
        **uvicorn_options(settings),  # header, body and keep-alive timeouts, the connection cap
    )
    server = uvicorn.Server(config)
    tune_gc()  # the app and its tokenizers are built: what startup made is never walked again
    server.run(sockets=[shared_socket(args.host, args.port)] if args.reuse_port else None)


def shared_socket(host: str, port: int) -> socket.socket:
    """A listening socket other processes may bind too (SO_REUSEPORT), as uvicorn would bind it."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(address)
    sock.set_inheritable(True)
    return sock


if __name__ == "__main__":
    main()
