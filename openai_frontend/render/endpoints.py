"""The generation endpoints by kind, for whoever answers a request it did not receive itself (a
fetch or resume by id, a batch line)."""

from __future__ import annotations

from openai_frontend.generate.request import Kind
from openai_frontend.render.answer import Endpoint
from openai_frontend.render.chat import CHAT
from openai_frontend.render.completion import COMPLETION

ENDPOINTS: dict[Kind, Endpoint] = {"chat": CHAT, "completion": COMPLETION}
