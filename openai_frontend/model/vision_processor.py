"""A vision-language model's own processor, in the gateway: it turns a rendered prompt and its images
into the prompt's token ids (each image's placeholder expanded as the model expects it) and, per
image, the tensors its vision encoder reads, as MultiModalFeatures (common/protocol.py).

Loaded only for a checkpoint whose config.json has a `vision_config`: one of the families the worker
serves with images (VISION_ARCHITECTURES), refused by name otherwise. It needs transformers (and
through it torch) in the gateway; a text-only model's gateway imports neither.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from common.protocol import MultiModalFeature, PlaceholderRange, TensorData

# The families served with images, by the architecture config.json names.
VISION_ARCHITECTURES = (
    "LlavaForConditionalGeneration",
    "Gemma3ForConditionalGeneration",
    "Qwen2_5_VLForConditionalGeneration",
)
# Outputs of the processor that belong to the text, not to an image.
_TEXT_OUTPUTS = frozenset({"input_ids", "attention_mask", "token_type_ids", "mm_token_type_ids"})


class VisionProcessorError(ValueError):
    """The processor refused the prompt and its images (placeholders and images do not match)."""


def _config(model_dir: Path) -> dict[str, Any]:
    path = model_dir / "config.json"
    if not path.is_file():
        return {}
    with path.open(encoding="utf-8") as f:
        data = json.load(f)
    return data if isinstance(data, dict) else {}


def load_vision_processor(model_dir: Path) -> VisionProcessor | None:
    """The processor of the vision-language model at `model_dir`; None for a text-only model. Raises
    ValueError (the gateway stops, saying why) for a vision model it cannot serve images for."""
    config = _config(model_dir)
    if "vision_config" not in config:
        return None
    architecture = next(iter(config.get("architectures") or []), config.get("model_type", "?"))
    if architecture not in VISION_ARCHITECTURES:
        raise ValueError(
            f"{model_dir} is a vision-language model ({architecture}); this server serves images for "
            f"{', '.join(VISION_ARCHITECTURES)} only"
        )
    if (
        not (model_dir / "preprocessor_config.json").is_file()
        and not (model_dir / "processor_config.json").is_file()
    ):
        raise ValueError(
            f"{model_dir} holds a vision-language model ({architecture}) but no image processor "
            "(preprocessor_config.json): save the model's processor beside it"
        )
    try:
        processor = load_processor(model_dir)
    except ImportError as exc:
        raise ValueError(
            f"{model_dir} is a vision-language model: its processor needs transformers and Pillow in the "
            "gateway (pip install 'cbserve[vision]')"
        ) from exc
    if getattr(processor.image_processor, "do_pan_and_scan", False):
        raise ValueError(
            f"{model_dir}: Gemma 3's pan and scan is not supported; set do_pan_and_scan to false"
        )
    # The token each image embedding goes to (LLaVA's <image>, Gemma 3's soft token, Qwen's image_pad).
    image_token_id = config.get("image_token_index", config.get("image_token_id"))
    if not isinstance(image_token_id, int):
        raise ValueError(f"{model_dir}/config.json names no image token (image_token_index)")
    return VisionProcessor(architecture, processor, image_token_id)


def load_processor(model_dir: Path) -> Any:
    """transformers' processor of the checkpoint (`AutoProcessor`), or, where its class also wants a
    video processor and torchvision (which every video processor needs) is not installed, the same
    class made with none: images never reach it, and their outputs are the class's own."""
    from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer
    from transformers.utils import is_torchvision_available

    processor_class = _processor_class(model_dir)
    if is_torchvision_available() or "video_processor" not in processor_class.get_attributes():
        return AutoProcessor.from_pretrained(model_dir)
    template = model_dir / "chat_template.jinja"
    return images_only(processor_class)(
        image_processor=AutoImageProcessor.from_pretrained(model_dir),
        tokenizer=AutoTokenizer.from_pretrained(model_dir),
        video_processor=None,
        chat_template=template.read_text(encoding="utf-8") if template.is_file() else None,
    )


def _processor_class(model_dir: Path) -> Any:
    import transformers

    for name in ("processor_config.json", "preprocessor_config.json"):
        path = model_dir / name
        if path.is_file():
            found = json.loads(path.read_text(encoding="utf-8")).get("processor_class")
            if isinstance(found, str) and hasattr(transformers, found):
                return getattr(transformers, found)
    return transformers.ProcessorMixin


def images_only(processor_class: Any) -> Any:
    """`processor_class` (a transformers processor with a video processor) that accepts none."""

    class ImagesOnly(processor_class):
        def check_argument_for_proper_class(self, argument_name: str, argument: Any) -> Any:
            if argument is None and argument_name == "video_processor":
                return type(None)
            return super().check_argument_for_proper_class(argument_name, argument)

    ImagesOnly.__name__ = ImagesOnly.__qualname__ = processor_class.__name__
    return ImagesOnly


@dataclass(slots=True)
class VisionProcessor:
    architecture: str  # one of VISION_ARCHITECTURES
    processor: Any  # transformers' ProcessorMixin of the checkpoint
    image_token_id: int
    # The fast tokenizer inside is not safe to call from two prepare threads at once.
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def chat_template(self) -> str | None:
        template = getattr(self.processor, "chat_template", None)
        return template if isinstance(template, str) else None

    def process(
        self, text: str, images: list[Any], add_special_tokens: bool
    ) -> tuple[list[int], list[MultiModalFeature]]:
        """The token ids of `text` with each image's placeholders expanded, and each image's feature
        (in prompt order)."""
        try:
            with self._lock:
                out = self.processor(
                    text=[text],
                    images=[images] if images else None,
                    return_tensors="np",
                    add_special_tokens=add_special_tokens,
                )
        except ValueError as exc:
            raise VisionProcessorError(str(exc)) from exc
        token_ids = [int(t) for t in out["input_ids"][0]]
        if not images:
            return token_ids, []
        tensors = {name: np.asarray(value) for name, value in out.items() if name not in _TEXT_OUTPUTS}
        lengths = self._num_tokens(tensors, token_ids, len(images))
        ranges = _placeholder_ranges(token_ids, self.image_token_id, lengths)
        features = [_feature(_image_slice(tensors, i, len(images)), ranges[i]) for i in range(len(images))]
        return token_ids, features

    def _num_tokens(self, tensors: dict[str, np.ndarray], token_ids: list[int], num_images: int) -> list[int]:
        """Each image's placeholder tokens: Qwen2.5-VL's from its grid (merged patches), the fixed-size
        families' an equal share of them all."""
        grid = tensors.get("image_grid_thw")
        if grid is not None:
            merge = int(self.processor.image_processor.merge_size) ** 2
            return [int(np.prod(grid[i])) // merge for i in range(num_images)]
        total = token_ids.count(self.image_token_id)
        if total % num_images:
            raise VisionProcessorError(f"{total} image tokens do not split evenly over {num_images} images")
        return [total // num_images] * num_images


def _placeholder_ranges(
    token_ids: list[int], image_token_id: int, lengths: list[int]
) -> list[PlaceholderRange]:
    """Each image's run of image tokens, in order (runs of two images may touch)."""
    positions = [i for i, t in enumerate(token_ids) if t == image_token_id]
    if len(positions) != sum(lengths):
        raise VisionProcessorError(
            f"the prompt holds {len(positions)} image tokens, its images {sum(lengths)}"
        )
    ranges, at = [], 0
    for length in lengths:
        offset = positions[at]
        if positions[at + length - 1] != offset + length - 1:
            raise VisionProcessorError("an image's placeholder tokens are not contiguous")
        ranges.append(PlaceholderRange(offset=offset, length=length))
        at += length
    return ranges


def _image_slice(tensors: dict[str, np.ndarray], index: int, num_images: int) -> dict[str, np.ndarray]:
    """Image `index`'s rows of each output: its patches of Qwen's flat pixel_values (by its grid),
    else row `index` of a per-image batch. Rows kept 2-D or more, so that concatenating the slices of
    several images along the first axis gives the processor's output for them together."""
    grid = tensors.get("image_grid_thw")
    out = {}
    for name, value in tensors.items():
        if grid is not None and name == "pixel_values":
            counts = [int(np.prod(g)) for g in grid]
            start = sum(counts[:index])
            out[name] = value[start : start + counts[index]]
        elif value.ndim and value.shape[0] == num_images:
            out[name] = value[index : index + 1]
    return out


def _feature(tensors: dict[str, np.ndarray], mm_position: PlaceholderRange) -> MultiModalFeature:
    """The image's feature, identified by the hash of its processed tensors (names, types, shapes, bytes)."""
    digest = hashlib.sha256()
    data = {}
    for name in sorted(tensors):
        value = np.ascontiguousarray(tensors[name])
        value = value.astype(value.dtype.newbyteorder("<"), copy=False)  # the wire is little-endian
        raw = value.tobytes()
        data[name] = TensorData(dtype=value.dtype.name, shape=list(value.shape), data=raw)
        digest.update(f"{name}:{value.dtype.name}:{value.shape}:".encode())
        digest.update(raw)
    return MultiModalFeature(identifier=digest.hexdigest(), mm_position=mm_position, data=data)
