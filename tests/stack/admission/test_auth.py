"""API keys: every path but /health needs one; refused requests leave nothing in Redis; the key's
name (never the key) travels with the request as its owner."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.key_hashes import parse_key_hashes
from gateway.security.api_keys import ApiKeys, hash_key
from gateway.settings import GatewaySettings
from harness.gateway.gateway_server import RunningGateway
from harness.gateway.responder import responding

ALICE, BOB, NAMELESS = "sk-alice-secret", "sk-bob-secret", "sk-nameless"
BODY = {"prompt": "hi", "max_tokens": 2}


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture()
def secured(make_gateway: Callable[..., RunningGateway], tmp_path: Path) -> RunningGateway:
    keys_file = tmp_path / "keys"
    keys_file.write_text(f"# operators\nbob:{hash_key(BOB)}  # bob's key\n\n{hash_key(NAMELESS)}\n")
    return make_gateway(api_key_hashes=f"alice:{hash_key(ALICE)}", api_keys_file=keys_file)


def _assert_401(response: httpx.Response) -> None:
    assert response.status_code == 401, response.text
    assert response.headers["www-authenticate"] == "Bearer"
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == "invalid_api_key" and error["message"]


@pytest.mark.parametrize(
    "headers",
    [
        {},
        _bearer("sk-wrong"),
        _bearer(ALICE + "x"),
        {"Authorization": "Bearer"},
        {"Authorization": f"Basic {ALICE}"},
        {"Authorization": ALICE},
        {"Api-Key": ALICE},
        {"X-Api-Key": ALICE + "x"},
    ],
    ids=["none", "wrong", "longer", "empty", "basic", "no-scheme", "other-header", "wrong-x-api-key"],
)
@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/completions"),
        ("POST", "/v1/chat/completions"),
        ("GET", "/v1/models"),
        ("GET", "/openapi.json"),
        ("GET", "/docs"),
        ("GET", "/no/such/route"),
    ],
)
def test_refused_without_a_valid_key(
    secured: RunningGateway, method: str, path: str, headers: dict[str, str]
) -> None:
    _assert_401(secured.client.request(method, path, json=BODY, headers=headers))
    # Nothing reached Redis: not a request, not a rate-limit counter.
    assert secured.harness.redis.dbsize() == 0


def test_health_needs_no_key(secured: RunningGateway) -> None:
    secured.harness.heartbeat()
    assert secured.client.get("/health").status_code == 200


def test_each_key_is_its_own_owner(secured: RunningGateway, redis_url: str) -> None:
    with responding(redis_url) as responder:
        for key in (ALICE, BOB, NAMELESS):
            response = secured.client.post("/v1/completions", json=BODY, headers=_bearer(key))
            assert response.status_code == 200, response.text
        chat = secured.client.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
            headers={"authorization": f"bearer {ALICE}"},  # scheme and header names are case-blind
        )
        assert chat.status_code == 200, chat.text
        models = secured.client.get("/v1/models", headers=_bearer(BOB))
        assert models.status_code == 200
    owners = [r.owner for r in responder.requests]
    assert owners == ["alice", "bob", f"key-{hash_key(NAMELESS)[:8]}", "alice"]
    # The key itself is nowhere in what was stored.
    dump = b"".join(secured.harness.redis.dump(k) or b"" for k in secured.harness.redis.keys("*"))
    for key in (ALICE, BOB, NAMELESS):
        assert key.encode() not in dump


def test_open_api_without_keys_has_no_owner(gateway: RunningGateway, redis_url: str) -> None:
    with responding(redis_url) as responder:
        assert gateway.client.post("/v1/completions", json=BODY).status_code == 200
    assert responder.requests[0].owner == ""


def test_lookup_compares_digests() -> None:
    keys = ApiKeys(parse_key_hashes([f"a:{hash_key('k1')}", f"b:{hash_key('k2').upper()}"], "test"))
    assert keys.owner_of("k1") == "a"
    assert keys.owner_of("k2") == "b"
    assert keys.owner_of("k3") is None
    assert not ApiKeys([]).enabled


@pytest.mark.parametrize(
    ("hashes", "message"),
    [
        ("alice:abc", "sha256"),
        ("alice:" + "g" * 64, "sha256"),
        (f"a b:{hash_key('x')}", "key name"),
        (f"a:{hash_key('x')},a:{hash_key('y')}", "unique"),
    ],
)
def test_bad_key_config_fails_at_startup(tiny_model_dir: Path, hashes: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GatewaySettings(model=tiny_model_dir, api_key_hashes=hashes)


def test_missing_keys_file_fails_at_startup(tiny_model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="GATEWAY_API_KEYS_FILE"):
        GatewaySettings(model=tiny_model_dir, api_keys_file=tmp_path / "nope")


def test_hash_key_cli_matches_sha256sum() -> None:
    def run(*args: str, stdin: str = "") -> Any:
        return subprocess.run(
            [sys.executable, "-m", "gateway", "hash-key", *args], input=stdin, capture_output=True, text=True
        )

    named = run("--name", "carol", stdin="sk-carol\n")
    assert named.returncode == 0, named.stderr
    assert named.stdout.strip() == f"carol:{hash_key('sk-carol')}"
    generated = run("--generate")
    key = generated.stderr.strip()
    assert key.startswith("sk-") and generated.stdout.strip() == hash_key(key)
    assert run(stdin="").returncode != 0
