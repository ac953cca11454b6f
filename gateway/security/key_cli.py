"""`python -m gateway hash-key [--name NAME] [--generate]`: the config line for an API key.

The key is read from stdin (never argv, which other users can see in `ps`), or generated with
`--generate` and printed once to stderr. stdout gets `name:digest`, ready for
GATEWAY_API_KEY_HASHES or a line of GATEWAY_API_KEYS_FILE.
"""

from __future__ import annotations

import argparse
import secrets
import sys

from gateway.key_hashes import parse_key_hashes
from gateway.security.api_keys import hash_key


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway hash-key", description=__doc__)
    parser.add_argument("--name", default="", help="the key's name: the owner recorded with its requests")
    parser.add_argument("--generate", action="store_true", help="make a new random key (printed to stderr)")
    args = parser.parse_args(argv)
    if args.generate:
        key = "sk-" + secrets.token_urlsafe(32)
        print(key, file=sys.stderr)
    else:
        key = sys.stdin.readline().rstrip("\r\n")
        if not key:
            parser.error("give the key on stdin, or --generate")
    line = f"{args.name}:{hash_key(key)}" if args.name else hash_key(key)
    try:
        parse_key_hashes([line], "--name")
    except ValueError as exc:
        parser.error(str(exc))
    print(line)
    return 0
