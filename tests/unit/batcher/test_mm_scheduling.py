"""Requests with images in the scheduler (batcher/core/multimodal.py, kv/prefix_cache.py): the encoder
budget per step, Gemma 3's image runs never split, image identifiers in the prefix-cache block
hashes, images refused where no worker takes them, and the images sent again with a request
rescheduled after preemption or failover. Hand-built steps, no Redis, no model."""

from __future__ import annotations

import msgspec

from batcher.core.kv.prefix_cache import block_hashes
from batcher.core.request import Request
from batcher.core.scheduler import Scheduler, SchedulerConfig
from common.protocol import MultiModalFeature, PlaceholderRange, TensorData, WorkerInfo
from tests.unit.batcher.test_scheduler import complete, request, worker

PIXELS = {"pixel_values": TensorData(dtype="float32", shape=[1], data=b"\0\0\0\0")}


def feature(identifier: str, offset: int, length: int) -> MultiModalFeature:
    return MultiModalFeature(
        identifier=identifier, mm_position=PlaceholderRange(offset=offset, length=length), data=PIXELS
    )


def vision_worker(worker_id: str = "w0", whole_images: bool = False, **kw: int) -> WorkerInfo:
    info = worker(worker_id, **kw)
    return msgspec.structs.replace(info, supports_multimodal=True, disable_chunked_mm_input=whole_images)


def with_images(req_id: str, prompt_len: int, *images: tuple[str, int, int]) -> Request:
    req = request(req_id, prompt_len=prompt_len)
    req.mm_features = [feature(*image) for image in images]
    return req


def make(*infos: WorkerInfo, encoder_budget: int | None = None, budget: int = 64) -> Scheduler:
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=budget, max_num_encoder_input_tokens=encoder_budget))
    for info in infos:
        s.add_worker(info)
    return s


def test_the_encoder_budget_stops_a_chunk_before_the_image_that_does_not_fit() -> None:
    s = make(vision_worker(), encoder_budget=20)
    # Three images of 10 tokens at 4, 20 and 36: two fit the step's encoder budget.
    s.add_request(with_images("a", 50, ("i1", 4, 10), ("i2", 20, 10), ("i3", 36, 10)), now=0.0)
    s.add_request(with_images("b", 30, ("i4", 2, 10)), now=0.0)
    out, _ = s.schedule("w0")
    assert out is not None
    assert out.num_scheduled_tokens == {"a": 36, "b": 2}  # a up to i3, b up to i4
    complete(s, out)
    out, _ = s.schedule("w0")
    assert out is not None
    assert out.num_scheduled_tokens == {"a": 14, "b": 28}  # i3 and i4: 20 tokens of encoder work


def test_the_first_image_of_a_step_fits_however_large() -> None:
    s = make(vision_worker(), encoder_budget=8)
    s.add_request(with_images("a", 40, ("big", 0, 30)), now=0.0)
    out, _ = s.schedule("w0")
    assert out is not None and out.num_scheduled_tokens == {"a": 40}


def test_an_image_run_is_split_across_chunks_unless_the_worker_forbids_it() -> None:
    prompt = ("a", 40, ("img", 10, 16))
    split = make(vision_worker(), budget=16)
    split.add_request(with_images(*prompt), now=0.0)
    out, _ = split.schedule("w0")
    assert out is not None and out.num_scheduled_tokens == {"a": 16}  # 6 of its image's 16 tokens
    whole = make(vision_worker(whole_images=True), budget=16)
    whole.add_request(with_images(*prompt), now=0.0)
    out, _ = whole.schedule("w0")
    assert out is not None and out.num_scheduled_tokens == {"a": 10}  # stops before it
    complete(whole, out)
    out, _ = whole.schedule("w0")
    assert out is not None and out.num_scheduled_tokens == {"a": 16}  # the whole run in one chunk


def test_block_hashes_name_the_images_in_each_block() -> None:
    prompt = list(range(100, 124))  # 6 blocks of 4 tokens; the image fills tokens 8..15
    plain, first, second = (request(i, 24, prompt=list(prompt)) for i in ("p", "x", "y"))
    first.mm_features = [feature("image-x", 8, 8)]
    second.mm_features = [feature("image-y", 8, 8)]
    hashes = [block_hashes(r, 4) for r in (plain, first, second)]
    assert hashes[0][:2] == hashes[1][:2] == hashes[2][:2]  # before the image: the text's own
    assert len({h[2] for h in hashes}) == 3  # from the image on, each image names its blocks
    assert len({h[5] for h in hashes}) == 3  # and, chained, every block after it


def test_images_fail_at_once_where_no_worker_takes_them() -> None:
    s = make(worker())
    s.add_request(with_images("a", 20, ("img", 2, 4)), now=0.0)
    out, failed = s.schedule("w0")
    assert out is None and [r.req_id for r in failed] == ["a"]
    assert failed[0].error is not None and "takes no images" in failed[0].error


def test_a_rescheduled_request_carries_its_images_again() -> None:
    s = make(vision_worker("w0"), vision_worker("w1"))
    req = with_images("a", 20, ("img", 2, 4))
    s.add_request(req, now=0.0)
    sent = {w: s.schedule(w)[0] for w in ("w0", "w1")}
    [holder] = [w for w, out in sent.items() if out is not None]
    assert [n.mm_features for n in sent[holder].scheduled_new_reqs] == [req.mm_features]  # type: ignore[union-attr]
    s.remove_worker(holder)  # it died: the request waits to be recomputed on the other
    out, _ = s.schedule("w1" if holder == "w0" else "w0")
    assert out is not None and [n.mm_features for n in out.scheduled_new_reqs] == [req.mm_features]
