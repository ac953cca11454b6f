"""The dashboard page in headless Chromium with API keys on: it loads without a key, shows nothing
until one is entered, then follows the events with it (fetch + Authorization: EventSource cannot)."""

from __future__ import annotations

from collections.abc import Callable

from playwright.sync_api import expect

from gateway.security.api_keys import hash_key
from harness.gateway.gateway_server import RunningGateway
from harness.user.browser import chromium

KEY = "sk-dashboard"
TIMEOUT_MS = 15_000


def test_the_page_asks_for_a_key(make_gateway: Callable[..., RunningGateway]) -> None:
    gateway = make_gateway(api_key_hashes=f"viewer:{hash_key(KEY)}")
    with chromium() as browser:
        page = browser.new_page()
        page.goto(f"{gateway.url}/dashboard")
        connection = page.get_by_test_id("connection")
        expect(connection).to_have_attribute("data-state", "unauthorized", timeout=TIMEOUT_MS)
        expect(connection).to_have_text("API key required")
        expect(page.get_by_test_id("model")).to_have_text("")

        page.get_by_test_id("api-key").fill("sk-wrong")
        page.get_by_text("Use key").click()
        expect(connection).to_have_text("wrong API key", timeout=TIMEOUT_MS)

        page.get_by_test_id("api-key").fill(KEY)
        page.get_by_text("Use key").click()
        expect(connection).to_have_attribute("data-state", "live", timeout=TIMEOUT_MS)
        expect(page.get_by_test_id("model")).to_have_text(f"model: {gateway.settings.model_name}")
        # The key outlives a reload of the tab (sessionStorage), not the tab itself.
        page.reload()
        expect(connection).to_have_attribute("data-state", "live", timeout=TIMEOUT_MS)
