"""An image's bytes decoded with Pillow and checked: a PNG, JPEG, WebP or GIF (its first frame),
within the pixel cap, upright and RGB, before anything is queued."""

from __future__ import annotations

import io
import warnings

from PIL import Image, ImageOps, UnidentifiedImageError

from openai_frontend.media.rules import MediaRules
from openai_frontend.protocol.errors import invalid_request

# Pillow's format names: what OpenAI's vision API accepts (its GIFs non-animated; we read the first frame).
FORMATS = ("PNG", "JPEG", "WEBP", "GIF")


def decode_image(data: bytes, rules: MediaRules, param: str) -> Image.Image:
    """The RGB image `data` encodes; a 400 naming `param` for another format, a broken file or one
    past GATEWAY_MAX_IMAGE_PIXELS (checked from the header, before the pixels are decoded)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # our own cap decides
            image = Image.open(io.BytesIO(data), formats=FORMATS)
    except Image.DecompressionBombError:
        raise _too_many_pixels(None, rules, param) from None
    except (UnidentifiedImageError, OSError, ValueError):
        raise invalid_request(
            "the image is not a PNG, JPEG, WebP or GIF file Pillow can read", param, "invalid_image"
        ) from None
    width, height = image.size
    if width * height > rules.max_image_pixels:
        raise _too_many_pixels((width, height), rules, param)
    if width == 0 or height == 0:
        raise invalid_request("the image has no pixels", param, "invalid_image")
    try:
        image.seek(0)  # a GIF's first frame
        # Upright as the camera's EXIF says, as transformers' load_image turns it.
        return ImageOps.exif_transpose(image).convert("RGB")
    except (OSError, ValueError, SyntaxError) as exc:
        raise invalid_request(f"the image does not decode: {exc}", param, "invalid_image") from None


def _too_many_pixels(size: tuple[int, int] | None, rules: MediaRules, param: str) -> Exception:
    what = f"{size[0]}x{size[1]} pixels" if size else "more pixels than Pillow opens"
    return invalid_request(
        f"the image has {what}, more than the {rules.max_image_pixels} this server accepts "
        "(GATEWAY_MAX_IMAGE_PIXELS)",
        param,
        "image_too_large",
    )
