"""The dashboard of a gateway of two models (GATEWAY_MODELS_CONFIG): a model picker, whose choice the
events feed (`?model=`) and the playground's requests follow. No batcher or worker is needed: what is
checked is what the page asks the gateway for."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from playwright.sync_api import expect

from gateway.settings import GatewaySettings
from harness.gateway.gateway_server import start_server
from harness.user.browser import chromium

TIMEOUT_MS = 15_000


@pytest.fixture()
def two_models_url(redis_url: str, tiny_model_dir: Path, tmp_path: Path) -> Iterator[str]:
    config = tmp_path / "models.json"
    entries = [
        {"model": str(tiny_model_dir), "served_model_name": name, "cells": [name]} for name in ("one", "two")
    ]
    config.write_text(json.dumps({"models": entries}))
    server: uvicorn.Server
    thread: threading.Thread
    server, thread, url = start_server(GatewaySettings(models_config=config, redis_url=redis_url))
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=15)


def test_the_page_follows_the_model_chosen(two_models_url: str) -> None:
    with chromium() as browser:
        page = browser.new_page()
        with page.expect_request(re.compile(r"/v1/dashboard/events\?model=one$")):
            page.goto(f"{two_models_url}/dashboard")
        select = page.get_by_test_id("model-select")
        expect(select).to_be_visible(timeout=TIMEOUT_MS)
        expect(page.get_by_test_id("model")).to_have_text("model: one")
        assert select.locator("option").all_inner_texts() == ["one", "two"]

        with page.expect_request(re.compile(r"/v1/dashboard/events\?model=two$")):
            select.select_option("two")
        expect(page.get_by_test_id("model")).to_have_text("model: two")
        with page.expect_request(re.compile(r"/v1/chat/completions$")) as sent:
            page.get_by_test_id("send").click()
        assert json.loads(sent.value.post_data or "{}")["model"] == "two"
        page.get_by_test_id("stop").click()
