"""The dashboard: a static page (playground + live batch view) and the data it draws, as SSE.

The page and its two assets need no API key: they are the same files for everyone and hold no data.
Everything they show comes from key-protected endpoints (`/v1/dashboard/events`, `/v1/models`, the
chat completions the playground sends), which the page calls with `fetch` and an `Authorization`
header from its key field: the browser's EventSource cannot send headers.
"""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import FileResponse, StreamingResponse

from gateway.app_state import State
from gateway.dashboard_assets import ASSETS, STATIC_DIR
from gateway.observability.dashboard_events import dashboard_events
from gateway.streaming.sse import SSE_HEADERS

router = APIRouter()


def _asset_route(path: str, file_name: str, media_type: str) -> None:
    async def serve() -> FileResponse:
        # no-cache: a browser revalidates (ETag), so an upgraded gateway never runs an old script.
        return FileResponse(
            STATIC_DIR / file_name, media_type=media_type, headers={"Cache-Control": "no-cache"}
        )

    router.add_api_route(path, serve, methods=["GET"], include_in_schema=False)


for _path, (_file, _media_type) in ASSETS.items():
    _asset_route(_path, _file, _media_type)


# Not in the OpenAPI schema: an endless stream for one page is no API for clients (nor for fuzzers).
@router.get("/v1/dashboard/events", include_in_schema=False)
async def events(state: State, model: str | None = None) -> StreamingResponse:
    """`event: step` per traced step (common/trace_schema.StepTrace), `event: stats` once a second, of
    the default model's home cell, or `?model=`'s (gateway/app_state.py `home_cell`)."""
    keys = state.home_keys(model)
    return StreamingResponse(
        dashboard_events(state.redis, keys), media_type="text/event-stream", headers=SSE_HEADERS
    )
