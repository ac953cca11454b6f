"""The step loop's copies between host and device never block the host (harness/gpu_worker/copy_rules.py):
the step's inputs go through the persistent pinned buffers, one non-blocking copy each; the sampling
state's index through double-buffered staging; the sampled ids come back into pinned memory on a side
stream, and the host waits on their event only when it reads them."""

from __future__ import annotations

import pytest
import torch

from common.protocol import SamplingParams
from gpu_worker.runner.attention.selector import make_attention_backend
from gpu_worker.runner.block_table import BlockTable
from gpu_worker.runner.cached_request_state import CachedRequestState
from gpu_worker.runner.host_copies import DeviceToHost, PinnedRing
from gpu_worker.runner.input_batch import ScheduledRequest, build_input_batch
from gpu_worker.runner.kv_cache import KVCache
from gpu_worker.runner.sample.sampling_state import SamplingState
from gpu_worker.runner.step.launched import PLACEHOLDER, take_device_tokens
from gpu_worker.runner.step_input_buffers import StepInputBuffers
from harness.gpu_worker.copy_rules import DEVICE, CopyViolation, copy_rules

BLOCK_SIZE = 4


def _request(i: int, context_len: int, num_tokens: int) -> ScheduledRequest:
    blocks = -(-(context_len + num_tokens) // BLOCK_SIZE)
    state = CachedRequestState(
        req_id=f"r{i}",
        token_ids=list(range(context_len + num_tokens)),
        num_prompt_tokens=context_len + num_tokens,
        sampling_params=SamplingParams(temperature=0.0),
        block_ids=list(range(8 * i, 8 * i + blocks)),
        num_computed_tokens=context_len,
        attempt=0,
    )
    return ScheduledRequest(state, num_tokens)


def test_the_rules_fail_on_blocking_copies() -> None:
    with copy_rules():
        x = torch.zeros(3, device=DEVICE)
        with pytest.raises(CopyViolation, match="pageable host memory"):
            torch.ones(3).to(DEVICE, non_blocking=True)
        with pytest.raises(CopyViolation, match="a blocking host-to-device copy"):
            torch.ones(3).pin_memory().to(DEVICE)
        with pytest.raises(CopyViolation, match="reads a device value on the host"):
            x.sum().item()
        with pytest.raises(CopyViolation, match="device-to-host copy into new"):
            x.cpu()


def test_step_inputs_are_one_pinned_copy_per_buffer_and_wait_only_for_the_last_step() -> None:
    steps = [[_request(0, 9, 1), _request(1, 4, 1), _request(2, 0, 6)], [_request(0, 10, 1)]]
    with copy_rules() as rules:
        sizes = {"num_layers": 1, "num_blocks": 32, "num_kv_heads": 1, "head_dim": 2}
        pool = KVCache.allocate(**sizes, block_size=BLOCK_SIZE, dtype=torch.float32, device=DEVICE)
        backend = make_attention_backend("triton", pool, group_decodes=False, dtype=torch.float32)
        buffers = StepInputBuffers(4, 16, 8, DEVICE)
        table = BlockTable(4, 8)
        num_copies = []
        for requests in steps:
            before = len(rules.host_to_device)
            batch = build_input_batch(requests, backend, DEVICE, table, buffers=buffers)
            num_copies.append(len(rules.host_to_device) - before)
            assert batch.input_ids.device == DEVICE and batch.attn_metadata.common.block_tables.is_meta
    # input ids, positions, slot mapping, query starts, sequence lengths, block tables, sampling rows.
    assert num_copies == [7, 7]
    # The second step waited for the first step's copies (one event), nothing else.
    assert len(rules.events) == 2 and rules.waits == [rules.events[0]]


def test_sampling_index_is_double_buffered_and_sampled_ids_come_back_behind_an_event() -> None:
    with copy_rules() as rules:
        state = SamplingState(32, DEVICE)
        for i in range(3):
            state.add(f"r{i}", SamplingParams(temperature=0.0, logprobs=1), [1, 2], [])
        first = len(rules.events)
        for _ in range(3):
            state.prepare(["r0", "r1", "r2"])
        staging = rules.events[first:]
        # Each buffer waits, before it is written again, for its own last copy: never the other's.
        assert rules.waits == [staging[0]]
        copies = DeviceToHost(DEVICE)
        values = copies.start(torch.zeros(3, dtype=torch.long, device=DEVICE))
        assert rules.device_to_host == [(24, "side")]
        ready = rules.events[-1]
        assert ready.recorded_on == "side" and ready.num_waits == 0  # the host has not waited yet
        assert len(values.tolist()) == 3 and ready.num_waits == 1  # (a meta copy carries no values)


def test_a_decode_takes_the_token_of_a_step_still_on_the_device_without_reading_it() -> None:
    # r1's last token is the placeholder of a step not yet read: its input comes from that step's ids.
    requests = [_request(0, 9, 1), _request(1, 4, 1), _request(2, 0, 6)]
    requests[1].state.token_ids[-1] = PLACEHOLDER
    with copy_rules() as rules:
        sizes = {"num_layers": 1, "num_blocks": 32, "num_kv_heads": 1, "head_dim": 2}
        pool = KVCache.allocate(**sizes, block_size=BLOCK_SIZE, dtype=torch.float32, device=DEVICE)
        backend = make_attention_backend("triton", pool, group_decodes=False, dtype=torch.float32)
        batch = build_input_batch(
            requests, backend, DEVICE, BlockTable(4, 8), buffers=StepInputBuffers(4, 16, 8, DEVICE)
        )
        sampled = torch.zeros(5, dtype=torch.long, device=DEVICE)  # the earlier step's ids, on the device
        before = len(rules.host_to_device)
        take_device_tokens(batch, {"r1": (sampled, 3), "r2": (sampled, 4)}, PinnedRing(torch.long, DEVICE))
        # One pinned copy of the index (r1's flat position, its row); r2 holds no placeholder.
        assert rules.host_to_device[before:] == [16]


def test_sampled_ids_are_never_copied_over_before_the_host_reads_them() -> None:
    with copy_rules():
        copies = DeviceToHost(DEVICE)
        started = [copies.start(torch.zeros(3, dtype=torch.long, device=DEVICE)) for _ in range(2)]
        first, second = (values.host.data_ptr() for values in started)
        assert first != second  # the first still unread: the second copy has a buffer of its own
        started[0].wait()
        started += [copies.start(torch.zeros(3, dtype=torch.long, device=DEVICE)) for _ in range(2)]
        third, fourth = (values.host.data_ptr() for values in started[2:])
        assert third == first  # the first one's buffer, read, is used again
        assert fourth not in {first, second}  # the second one's, unread, is not
