"""An image's bytes from the URL a request gives: a data: URL (base64) always, an http(s) URL only
from a host the operator allows (addresses.py), within the size and time limits (rules.py).

Redirects are followed by hand, at most MAX_REDIRECTS, each target checked as the first URL was, so
an allowed host cannot redirect the gateway to a private address.
"""

from __future__ import annotations

import base64
import binascii
import time
from urllib.parse import urljoin, urlsplit

import httpx

from openai_frontend.media.addresses import check_domain, refused_url, resolve
from openai_frontend.media.rules import MediaRules
from openai_frontend.protocol.errors import OpenAIError, invalid_request

MAX_REDIRECTS = 5
_DEFAULT_PORTS = {"http": 80, "https": 443}


def _failed(message: str, param: str) -> OpenAIError:
    return invalid_request(message, param, "image_fetch_failed")


def _too_large(rules: MediaRules, param: str) -> OpenAIError:
    return invalid_request(
        f"the image is larger than {rules.max_image_bytes} bytes (GATEWAY_MAX_IMAGE_BYTES)",
        param,
        "image_too_large",
    )


def image_bytes(url: str, rules: MediaRules, param: str) -> bytes:
    """The encoded image `url` holds or names; a 400 naming `param` when it is refused."""
    if url[:5].lower() == "data:":
        return _data_url(url, rules, param)
    scheme = urlsplit(url).scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        raise invalid_request(
            f"an image URL is a data: URL (base64) or an http(s) URL, not {scheme or 'a relative'!r} one",
            param,
            "invalid_image_url",
        )
    if not rules.fetches_urls:
        raise refused_url(
            "this server fetches no image URLs (GATEWAY_ALLOWED_MEDIA_DOMAINS is empty): send the image "
            "inline, as a data: URL with its base64 bytes",
            param,
        )
    return _fetch(url, rules, param)


def _data_url(url: str, rules: MediaRules, param: str) -> bytes:
    header, comma, payload = url.partition(",")
    if not comma or not header.lower().endswith(";base64"):
        raise invalid_request(
            "an image data: URL is data:<media type>;base64,<bytes in base64>", param, "invalid_image_url"
        )
    if len(payload) * 3 // 4 > rules.max_image_bytes:
        raise _too_large(rules, param)
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise invalid_request(f"the image's base64 does not decode: {exc}", param, "invalid_image") from None


def _fetch(url: str, rules: MediaRules, param: str) -> bytes:
    deadline = time.monotonic() + rules.fetch_timeout_s
    # trust_env off: no proxy from the environment sees (or bypasses the checks of) what is fetched.
    with httpx.Client(timeout=rules.fetch_timeout_s, follow_redirects=False, trust_env=False) as client:
        for _ in range(MAX_REDIRECTS + 1):
            try:
                response = client.send(_checked_request(client, url, rules, param), stream=True)
                try:
                    if response.is_redirect and "location" in response.headers:
                        url = urljoin(url, response.headers["location"])
                        continue
                    if response.status_code != 200:
                        raise _failed(f"fetching the image URL answered HTTP {response.status_code}", param)
                    return _body(response, rules, deadline, param)
                finally:
                    response.close()
            except httpx.TimeoutException:
                raise _failed(
                    f"fetching the image URL took longer than {rules.fetch_timeout_s} s", param
                ) from None
            except httpx.HTTPError as exc:
                raise _failed(f"fetching the image URL failed: {type(exc).__name__}", param) from None
    raise _failed(f"the image URL redirected more than {MAX_REDIRECTS} times", param)


def _checked_request(client: httpx.Client, url: str, rules: MediaRules, param: str) -> httpx.Request:
    """A GET of `url` sent to the address its host was checked at (TLS still verifies the host name)."""
    parts = httpx.URL(url)
    scheme = parts.scheme
    if scheme not in _DEFAULT_PORTS:
        raise refused_url(f"the image URL redirected to a {scheme!r} URL", param)
    host = parts.host
    if not host:
        raise invalid_request("the image URL names no host", param, "invalid_image_url")
    check_domain(host, rules, param)
    port = parts.port or _DEFAULT_PORTS[scheme]
    address = resolve(host, port, rules, param)
    host_header = host if parts.port is None else f"{host}:{parts.port}"
    return client.build_request(
        "GET",
        parts.copy_with(host=str(address)),
        headers={"Host": host_header, "Accept": "image/*"},
        extensions={"sni_hostname": host},
    )


def _body(response: httpx.Response, rules: MediaRules, deadline: float, param: str) -> bytes:
    declared = response.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > rules.max_image_bytes:
        raise _too_large(rules, param)
    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_bytes():
        size += len(chunk)
        if size > rules.max_image_bytes:
            raise _too_large(rules, param)
        if time.monotonic() > deadline:  # a slow trickle: each read is within the timeout, the whole not
            raise _failed(f"fetching the image URL took longer than {rules.fetch_timeout_s} s", param)
        chunks.append(chunk)
    return b"".join(chunks)
