"""Key layout for Redis Cluster (common/streams.py): what one script or transaction touches is in one
slot, a request's cell comes from its id, and the cluster node list parses (common/redis_io/redis_conn.py)."""

from __future__ import annotations

import dataclasses

import pytest
from redis.crc import key_slot

from common import streams
from common.redis_io.redis_conn import cluster_nodes


def _slot(key: str) -> int:
    return int(key_slot(key.encode()))


@pytest.mark.parametrize("cell", ["default", "a", "eu-west-2"])
def test_every_key_of_a_cell_and_of_its_requests_is_in_one_slot(cell: str) -> None:
    keys = streams.cell_keys(cell)
    req_id = streams.placed_req_id(cell, "3f2a")
    names = [getattr(keys, f.name) for f in dataclasses.fields(keys) if f.name != "cell"]
    names += [keys.worker_steps("w0"), keys.gateway_wake("g"), *streams.request_keys(req_id)]
    assert {_slot(name) for name in names} == {_slot(keys.requests)}
    assert all(name.startswith(f"llm:{{{cell}}}:") for name in names)


def test_a_request_id_names_its_cell() -> None:
    assert streams.placed_req_id("default", "abc") == "abc"  # ids of one-cell deployments are unchanged
    assert streams.placed_req_id("b", "abc") == "b~abc"
    assert streams.cell_of("b~abc") == "b"
    assert streams.cell_of("b~abc-1") == "b"  # choice n of a request stays with it
    assert streams.cell_of("abc") == streams.cell_of("celery-1") == "default"
    assert streams.cell_of("Not A Cell~x") == streams.cell_of("~x") == streams.cell_of("b~") == "default"
    with pytest.raises(ValueError, match="cell name"):
        streams.placed_req_id("{evil}", "abc")


def test_files_and_batches_share_one_slot_apart_from_cells() -> None:
    names = [
        streams.file_key("f"),
        streams.owner_files("o"),
        streams.batch_key("b"),
        streams.batch_input("b"),
    ]
    names += [streams.owner_batches("o"), streams.batch_claim("b"), streams.batch_outputs("b")]
    names += [streams.ACTIVE_BATCHES, streams.ORPHANED_BATCHES, streams.BATCH_REAPER_TURN]
    assert len({_slot(name) for name in names}) == 1


def test_cluster_nodes_parse_from_redis_url() -> None:
    nodes, options = cluster_nodes("rediss://user:p%40ss@10.0.0.1:7000,10.0.0.2:7001/0")
    assert nodes == [("10.0.0.1", 7000), ("10.0.0.2", 7001)]
    assert options == {"ssl": True, "username": "user", "password": "p@ss"}
    assert cluster_nodes("redis://h1:7000")[0] == [("h1", 7000)]
    with pytest.raises(ValueError, match="database 0"):
        cluster_nodes("redis://h1:7000/2")
