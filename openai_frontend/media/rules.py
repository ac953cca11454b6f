"""The operator's rules for the images requests carry (GATEWAY_* settings, docs/settings.md).

Kept with a model's rules (ModelRules.media), so that a batch's lines, rendered by a Celery worker,
are held to the gateway's own limits.
"""

from __future__ import annotations

import msgspec

# Pillow's own bomb guard is 89 M pixels; a vision encoder resizes to well under a megapixel anyway.
DEFAULT_MAX_IMAGE_PIXELS = 4096 * 4096


class MediaRules(msgspec.Struct, frozen=True, kw_only=True):
    # vLLM's --limit-mm-per-prompt {"image": N}: images in one request's messages.
    limit_images: int = 8
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS  # width x height of one decoded image
    # vLLM's --allowed-media-domains: hosts whose http(s) image URLs the gateway fetches. Empty: none
    # (data: URLs only); "*": any host that resolves to public addresses only.
    allowed_media_domains: tuple[str, ...] = ()
    # Fetch from hosts that resolve to private, loopback or link-local addresses (an internal image
    # store); off, such a host is refused however it is named.
    allow_private_media_addresses: bool = False
    fetch_timeout_s: float = 5.0  # vLLM's VLLM_IMAGE_FETCH_TIMEOUT: one fetch, redirects included
    max_image_bytes: int = 20 * 1024 * 1024  # an encoded image, fetched or inline

    @property
    def fetches_urls(self) -> bool:
        return bool(self.allowed_media_domains)
