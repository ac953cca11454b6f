"""Which hosts an image URL may name: the operator's allowed domains, and public addresses only.

A host is resolved here and every address it resolves to is checked before anything connects, and
the fetch then connects to a checked address (fetch.py), so a name that resolves to a public address
for the check and a private one for the connection (DNS rebinding) reaches nothing inside.
"""

from __future__ import annotations

import ipaddress
import socket

from openai_frontend.media.rules import MediaRules
from openai_frontend.protocol.errors import OpenAIError, invalid_request

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def refused_url(message: str, param: str) -> OpenAIError:
    return invalid_request(message, param, "image_url_not_allowed")


def check_domain(host: str, rules: MediaRules, param: str) -> None:
    """`host` is one of GATEWAY_ALLOWED_MEDIA_DOMAINS (exactly, as vLLM matches them), or any is."""
    allowed = rules.allowed_media_domains
    if "*" not in allowed and host.lower().rstrip(".") not in allowed:
        raise refused_url(f"image URLs from {host!r} are not allowed (GATEWAY_ALLOWED_MEDIA_DOMAINS)", param)


def is_public(address: IPAddress) -> bool:
    """A global unicast address: not private, loopback, link-local, shared, reserved or multicast
    (an IPv4 address written as IPv6, ::ffff:10.0.0.1, is judged as the IPv4 one)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_global and not address.is_multicast


def resolve(host: str, port: int, rules: MediaRules, param: str) -> IPAddress:
    """The address to connect to for `host`: each one it resolves to checked, the first returned."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise invalid_request(
            f"the image URL's host {host!r} does not resolve", param, "image_fetch_failed"
        ) from exc
    # An IPv6 scope ("fe80::1%eth0") is not part of the address.
    addresses = [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]
    if not rules.allow_private_media_addresses:
        for address in addresses:
            if not is_public(address):
                raise refused_url(
                    f"the image URL's host {host!r} resolves to {address}, a private, loopback or "
                    "link-local address: refused",
                    param,
                )
    if not addresses:
        raise invalid_request(f"the image URL's host {host!r} does not resolve", param, "image_fetch_failed")
    return addresses[0]
