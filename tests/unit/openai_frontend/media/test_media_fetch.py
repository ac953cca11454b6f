"""Image URLs fetched from a real HTTP server (a thread on 127.0.0.1, so the operator's switch for
private addresses is on): the image's bytes, redirects checked hop by hop, and the size and time
limits. What is refused without it (private addresses, hosts not allowed) is in test_image_prompts.py."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import msgspec
import pytest

from harness.models.vision import make_image
from openai_frontend.media.decode import decode_image
from openai_frontend.media.fetch import MAX_REDIRECTS, image_bytes
from openai_frontend.media.rules import MediaRules
from openai_frontend.protocol.errors import OpenAIError

PNG = make_image(7, (24, 16))
PARAM = "messages[0].content[0].image_url.url"


class _Images(BaseHTTPRequestHandler):
    stalled = threading.Event()  # set: /stall may return

    def do_GET(self) -> None:
        if self.path == "/cat.png":
            self._send(200, PNG)
        elif self.path == "/big.png":
            self._send(200, b"\0" * 4096)
        elif self.path.startswith("/to/"):  # a redirect to what follows /to/
            self.send_response(302)
            self.send_header("Location", self.path[len("/to/") :])
            self.end_headers()
        elif self.path == "/loop":
            self.send_response(302)
            self.send_header("Location", "/loop")
            self.end_headers()
        elif self.path == "/stall":
            self.stalled.wait(10)
            self._send(200, PNG)
        else:
            self._send(404, b"")

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        _Images.stalled.set()
        httpd.shutdown()
        thread.join(10)


# The server is on a loopback address: allowed here by the operator's switch, and by name.
INTERNAL = MediaRules(allowed_media_domains=("127.0.0.1",), allow_private_media_addresses=True)


def _refused(url: str, rules: MediaRules = INTERNAL) -> OpenAIError:
    with pytest.raises(OpenAIError) as caught:
        image_bytes(url, rules, PARAM)
    assert caught.value.status == 400 and caught.value.param == PARAM
    return caught.value


def test_an_allowed_url_is_fetched_and_decoded(server: str) -> None:
    data = image_bytes(f"{server}/cat.png", INTERNAL, PARAM)
    assert data == PNG
    assert decode_image(data, INTERNAL, PARAM).size == (24, 16)


def test_redirects_are_followed_within_the_rules(server: str) -> None:
    assert image_bytes(f"{server}/to//cat.png", INTERNAL, PARAM) == PNG
    # To a host the operator did not allow: refused, though it is the same server.
    port = server.rsplit(":", 1)[1]
    error = _refused(f"{server}/to/http://localhost:{port}/cat.png")
    assert error.code == "image_url_not_allowed" and "'localhost'" in error.message
    # Without the switch, the loopback address is refused before anything connects.
    public_only = MediaRules(allowed_media_domains=("127.0.0.1",))
    assert "private" in _refused(f"{server}/cat.png", public_only).message
    assert str(MAX_REDIRECTS) in _refused(f"{server}/loop").message


def test_size_and_time_limits(server: str) -> None:
    small = msgspec.structs.replace(INTERNAL, max_image_bytes=1000)
    assert _refused(f"{server}/big.png", small).code == "image_too_large"
    quick = msgspec.structs.replace(INTERNAL, fetch_timeout_s=0.3)
    error = _refused(f"{server}/stall", quick)
    assert error.code == "image_fetch_failed" and "0.3 s" in error.message
    assert _refused(f"{server}/missing.png").code == "image_fetch_failed"
