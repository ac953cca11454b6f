"""vLLM's runtime LoRA routes: POST /v1/load_lora_adapter and POST /v1/unload_lora_adapter.

Off unless GATEWAY_ALLOW_RUNTIME_LORA_UPDATING (vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING): then both
answer 404, as vLLM's unregistered routes do, saying how to turn them on. On, they take vLLM's bodies
and answer as vLLM does: 200 with a plain-text "Success: ..." line, 400 for a request or adapter that
cannot be loaded (the message names why), 404 for unloading an adapter that is not loaded. The
adapter is registered in Redis, so every gateway of the deployment serves it (or stops serving it) at
once: openai_frontend/model/lora_registry.py. They need the API key every route needs; there is no
separate admin key, as in vLLM.

An unloaded adapter's running requests finish: each carries its LoRARequest to the workers. New
requests naming it get the 404 of an unknown model.
"""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict
from starlette.responses import PlainTextResponse

from gateway.app_state import GatewayState, State
from gateway.lora.adapter_check import base_model_of, checked_adapter
from openai_frontend.protocol.errors import OpenAIError, invalid_request

router = APIRouter()


class LoadLoRAAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lora_name: str = ""
    lora_path: str = ""
    # Ours, for a server of several base models (vLLM's --lora-modules JSON form has it too).
    base_model_name: str | None = None
    load_inplace: bool = False  # vLLM's: replace a loaded adapter's weights


class UnloadLoRAAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lora_name: str = ""
    lora_int_id: int | None = None  # vLLM's other way to name one; adapters here have names only


def _check_enabled(state: GatewayState) -> None:
    if not state.settings.allow_runtime_lora_updating:
        raise OpenAIError(
            404,
            "loading and unloading LoRA adapters at run time is off: start the gateway with "
            "GATEWAY_ALLOW_RUNTIME_LORA_UPDATING=true (or use GATEWAY_LORA_MODULES)",
            code="not_found",
        )


@router.post("/v1/load_lora_adapter", response_class=PlainTextResponse)
async def load_lora_adapter(body: LoadLoRAAdapterRequest, state: State) -> PlainTextResponse:
    _check_enabled(state)
    if not body.lora_name or not body.lora_path:
        raise invalid_request("Both 'lora_name' and 'lora_path' must be provided.")
    if body.load_inplace:
        raise invalid_request(
            "load_inplace is not supported: unload the adapter first, or load its new weights under a "
            "new name",
            "load_inplace",
        )
    base = base_model_of(state.models, body.lora_name, body.lora_path, body.base_model_name)
    router = state.routers[base.rules.name]
    await router.refresh(state.redis)
    adapter = await checked_adapter(
        state.redis, base, router.cells, body.lora_name, body.lora_path, state.settings.max_lora_rank
    )
    if not await state.adapters.add(adapter):
        raise invalid_request(f"The lora adapter '{body.lora_name}' has already been loaded.", "lora_name")
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")


@router.post("/v1/unload_lora_adapter", response_class=PlainTextResponse)
async def unload_lora_adapter(body: UnloadLoRAAdapterRequest, state: State) -> PlainTextResponse:
    _check_enabled(state)
    if not body.lora_name:
        raise invalid_request(
            "'lora_name' must be provided: adapters here are unloaded by name.", "lora_name"
        )
    if not await state.adapters.remove(body.lora_name):
        raise OpenAIError(
            404, f"The lora adapter '{body.lora_name}' cannot be found.", param="lora_name", code="not_found"
        )
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")
