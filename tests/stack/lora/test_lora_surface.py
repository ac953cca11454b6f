"""LoRA adapters' HTTP surface, vLLM's: static adapters (GATEWAY_LORA_MODULES), runtime load and
unload behind GATEWAY_ALLOW_RUNTIME_LORA_UPDATING, /v1/models listing them, and a request naming one
queued with its LoRARequest. Real gateways (uvicorn) on a real Redis, real PEFT adapters; the worker's
part is played by the test (a registered WorkerInfo announcing its LoRA limits, a responder that
answers every request), so what is checked is the surface and what it queues."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest
import redis

from common.protocol import LoRARequest, WorkerInfo, encode
from common.streams import cell_keys
from gateway.app import create_app
from gateway.settings import GatewaySettings
from harness.gateway.gateway_server import RunningGateway
from harness.gateway.responder import responding
from harness.models.lora_adapters import build_lora_adapter
from harness.processes.services import wait_for

MAX_LORA_RANK = 8


@pytest.fixture(scope="module")
def adapters(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Adapters of the tiny model: one that fits, and one of each way not to."""
    root = tmp_path_factory.mktemp("adapters")
    other_base = _other_base(root / "other-base")
    (root / "empty").mkdir()
    return {
        "good": build_lora_adapter(tiny_model_dir, root / "good", rank=4),
        "second": build_lora_adapter(tiny_model_dir, root / "second", rank=2, seed=1),
        "big": build_lora_adapter(tiny_model_dir, root / "big", rank=16),
        "head": build_lora_adapter(tiny_model_dir, root / "head", target_modules=["q_proj", "lm_head"]),
        "other": build_lora_adapter(other_base, root / "other", rank=4),
        "empty": root / "empty",
    }


def _other_base(path: Path) -> Path:
    """A base model whose MLP is wider than the tiny model's: its adapters fit no tiny model layer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from harness.models.family_models import SMALL

    LlamaForCausalLM(LlamaConfig(**{**SMALL, "intermediate_size": 96})).save_pretrained(path)
    return path


def _register_worker(redis_url: str, max_loras: int, max_lora_rank: int) -> None:
    """A worker of the default cell announcing its LoRA limits, and a batcher lease (the cell is live)."""
    info = WorkerInfo(
        worker_id="w0",
        model="tiny",
        num_blocks=64,
        block_size=16,
        max_model_len=512,
        started_at=time.time(),
        max_loras=max_loras,
        max_lora_rank=max_lora_rank,
    )
    client = redis.Redis.from_url(redis_url)
    keys = cell_keys("default")
    client.hset(keys.workers, "w0", encode(info))
    client.set(keys.lease, "1:test-batcher", px=600_000)
    client.close()


@pytest.fixture()
def lora_gateway(make_gateway: Callable[..., RunningGateway], redis_url: str) -> Iterator[RunningGateway]:
    _register_worker(redis_url, max_loras=4, max_lora_rank=MAX_LORA_RANK)
    yield make_gateway(allow_runtime_lora_updating=True)


def _sdk(gateway: RunningGateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="none", timeout=30, max_retries=0)


def _load(gateway: RunningGateway, name: str, path: Path | str, **extra: object) -> httpx.Response:
    body = {"lora_name": name, "lora_path": str(path), **extra}
    return gateway.client.post("/v1/load_lora_adapter", json=body)


def test_runtime_updating_is_off_by_default(
    make_gateway: Callable[..., RunningGateway], adapters: dict[str, Path]
) -> None:
    gateway = make_gateway()
    for path, body in (
        ("/v1/load_lora_adapter", {"lora_name": "sql", "lora_path": str(adapters["good"])}),
        ("/v1/unload_lora_adapter", {"lora_name": "sql"}),
    ):
        response = gateway.client.post(path, json=body)
        assert response.status_code == 404  # as vLLM's routes, unregistered without the setting
        assert "GATEWAY_ALLOW_RUNTIME_LORA_UPDATING=true" in response.json()["error"]["message"]


def test_an_adapter_loaded_through_one_gateway_is_served_by_every_one_until_unloaded(
    lora_gateway: RunningGateway,
    make_gateway: Callable[..., RunningGateway],
    adapters: dict[str, Path],
    redis_url: str,
) -> None:
    other = make_gateway(allow_runtime_lora_updating=True)
    base = lora_gateway.settings.model_name
    response = _load(lora_gateway, "sql", adapters["good"])
    assert (response.status_code, response.text) == (200, "Success: LoRA adapter 'sql' added successfully.")
    assert response.headers["content-type"].startswith("text/plain")

    # Listed by both gateways, in vLLM's shape: its base model as parent, its directory as root.
    for gateway in (lora_gateway, other):
        with _sdk(gateway) as sdk:
            cards = {card.id: card for card in sdk.models.list().data}
            assert list(cards) == [base, "sql"]
            card = sdk.models.retrieve("sql")
        assert card.model_extra is not None
        assert (card.model_extra["parent"], card.model_extra["root"]) == (base, str(adapters["good"]))
        assert card.model_extra["max_model_len"] == 512

    # A request naming it carries its LoRARequest; the base model's carries none; both through the
    # other gateway too, which read the adapter from Redis.
    with responding(redis_url) as responder, _sdk(other) as sdk:
        answer = sdk.chat.completions.create(
            model="sql", messages=[{"role": "user", "content": "Hi"}], max_tokens=2
        )
        assert answer.model == "sql"
        sdk.completions.create(model=base, prompt="Hi", max_tokens=2)
        streamed = sdk.completions.create(model="sql", prompt="Hi", max_tokens=2, stream=True)
        assert {chunk.model for chunk in streamed} == {"sql"}
    lora = LoRARequest(lora_name="sql", lora_path=str(adapters["good"]))
    assert [r.lora_request for r in responder.requests] == [lora, None, lora]

    again = _load(other, "sql", adapters["second"])
    assert again.status_code == 400
    assert again.json()["error"]["message"] == "The lora adapter 'sql' has already been loaded."

    # Unloaded through the other gateway: gone for new requests on both (at once on the one that
    # unloaded it, within the registry's cache time on the other).
    response = other.client.post("/v1/unload_lora_adapter", json={"lora_name": "sql"})
    assert (response.status_code, response.text) == (200, "Success: LoRA adapter 'sql' removed successfully.")
    assert other.client.get("/v1/models/sql").status_code == 404
    wait_for(lambda: lora_gateway.client.get("/v1/models/sql").status_code == 404, 5, "the unload to be seen")
    with _sdk(lora_gateway) as sdk:
        with pytest.raises(openai.NotFoundError, match=f"this server serves `{base}`"):
            sdk.completions.create(model="sql", prompt="Hi", max_tokens=2)
        assert [card.id for card in sdk.models.list().data] == [base]
    response = other.client.post("/v1/unload_lora_adapter", json={"lora_name": "sql"})
    assert response.status_code == 404
    assert response.json()["error"]["message"] == "The lora adapter 'sql' cannot be found."


@pytest.mark.parametrize(
    ("adapter", "extra", "message"),
    [
        ("empty", {}, "has no adapter_config.json"),
        ("big", {}, "LoRA rank 16 is greater than max_lora_rank 8"),
        ("head", {}, "lm_head"),
        ("other", {}, "trained for another base model"),
        ("good", {"load_inplace": True}, "load_inplace is not supported"),
        ("good", {"base_model_name": "nope"}, "base_model_name 'nope' is not a served model"),
    ],
)
def test_an_adapter_that_cannot_run_is_a_400_naming_why(
    lora_gateway: RunningGateway,
    adapters: dict[str, Path],
    adapter: str,
    extra: dict[str, object],
    message: str,
) -> None:
    response = _load(lora_gateway, "bad", adapters[adapter], **extra)
    assert response.status_code == 400, response.text
    assert message in response.json()["error"]["message"]
    assert lora_gateway.client.get("/v1/models/bad").status_code == 404


def test_names_and_fields_a_load_needs(lora_gateway: RunningGateway, adapters: dict[str, Path]) -> None:
    base = lora_gateway.settings.model_name
    response = _load(lora_gateway, base, adapters["good"])
    assert response.status_code == 400
    assert (
        response.json()["error"]["message"]
        == f"The lora adapter name '{base}' conflicts with a served base model."
    )
    response = lora_gateway.client.post("/v1/load_lora_adapter", json={"lora_name": "x"})
    assert response.status_code == 400
    assert response.json()["error"]["message"] == "Both 'lora_name' and 'lora_path' must be provided."


def test_a_lower_gateway_limit_wins_over_the_workers(
    make_gateway: Callable[..., RunningGateway], adapters: dict[str, Path], redis_url: str
) -> None:
    _register_worker(redis_url, max_loras=4, max_lora_rank=MAX_LORA_RANK)
    gateway = make_gateway(allow_runtime_lora_updating=True, max_lora_rank=2)
    response = _load(gateway, "sql", adapters["good"])
    assert response.status_code == 400
    assert "LoRA rank 4 is greater than max_lora_rank 2" in response.json()["error"]["message"]
    assert _load(gateway, "small", adapters["second"]).status_code == 200


def test_static_adapters_are_served_from_the_start(
    make_gateway: Callable[..., RunningGateway], adapters: dict[str, Path], tiny_model_dir: Path
) -> None:
    base = tiny_model_dir.name
    chat = {"name": "chat", "path": str(adapters["second"]), "base_model_name": base}
    modules = f"sql={adapters['good']} {json.dumps(chat)}"
    gateway = make_gateway(lora_modules=modules)

    def listed() -> bool:
        ids = [card["id"] for card in gateway.client.get("/v1/models").json()["data"]]
        return ids[0] == base and set(ids[1:]) == {"sql", "chat"}

    wait_for(listed, 10, "the static adapters to be registered")
    # A bad one stops the gateway before it serves anything, naming it.
    bad = GatewaySettings(
        model=tiny_model_dir, lora_modules=f"big={adapters['big']}", max_lora_rank=MAX_LORA_RANK
    )
    with pytest.raises(ValueError, match="GATEWAY_LORA_MODULES: Invalid LoRA adapter 'big'"):
        create_app(bad)
    with pytest.raises(ValueError, match="must be name=path"):
        create_app(GatewaySettings(model=tiny_model_dir, lora_modules="nameless"))
