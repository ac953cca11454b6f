"""Stream replies as hiredis parses them, read into (entry id, field value) tuples."""

from __future__ import annotations

import hiredis

from common.redis_io.command_packer import pack, pack_all
from common.redis_io.stream_replies import entries, raw_entries, raw_reply, streams


def parse(wire: bytes) -> object:
    reader = hiredis.Reader()
    reader.feed(wire)
    return reader.gets()


def test_an_xread_reply_reads_as_streams_of_id_message_pairs() -> None:
    wire = (
        b"*1\r\n*2\r\n$1\r\nk\r\n*2\r\n"
        b"*2\r\n$3\r\n1-0\r\n*2\r\n$1\r\nm\r\n$2\r\nhi\r\n"
        b"*2\r\n$3\r\n2-0\r\n*4\r\n$1\r\nx\r\n$1\r\ny\r\n$1\r\nm\r\n$2\r\nho\r\n"
    )
    [(key, raw)] = streams(parse(wire))  # type: ignore[arg-type]
    assert key == "k"
    assert entries(raw) == [("1-0", b"hi"), ("2-0", b"ho")]  # `m` found among other fields too
    assert entries(raw, b"s") == [("1-0", None), ("2-0", None)]  # an entry without the field


def test_a_timed_out_read_has_no_streams() -> None:
    assert streams(parse(b"*-1\r\n")) == []  # type: ignore[arg-type]


def test_redis_pys_parsed_replies_read_the_same_as_hiredis_ones() -> None:
    parsed = [[b"k", [(b"1-0", {b"m": b"hi"})]]]
    assert raw_reply(parsed) == [[b"k", [[b"1-0", [b"m", b"hi"]]]]]
    assert raw_entries([(b"1-0", {b"m": b"hi"})]) == [[b"1-0", [b"m", b"hi"]]]


def test_commands_are_packed_as_redis_reads_them() -> None:
    assert (
        pack("XADD", b"k", "*", 3, 0.5)
        == b"*5\r\n$4\r\nXADD\r\n$1\r\nk\r\n$1\r\n*\r\n$1\r\n3\r\n$3\r\n0.5\r\n"
    )
    assert pack_all([("PING",), ("GET", "k")]) == b"*1\r\n$4\r\nPING\r\n*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"


def test_a_resp3_xread_reply_reads_as_a_resp2_one() -> None:
    wire = b"%1\r\n$1\r\nk\r\n*1\r\n*2\r\n$3\r\n1-0\r\n*2\r\n$1\r\nm\r\n$2\r\nhi\r\n"
    reader = hiredis.Reader()  # RESP3 maps need no option: hiredis reads them as dicts
    reader.feed(wire)
    [(key, raw)] = streams(reader.gets())
    assert (key, entries(raw)) == ("k", [("1-0", b"hi")])
    assert raw_reply({b"k": [[(b"1-0", {b"m": b"hi"})]]}) == [[b"k", [[b"1-0", [b"m", b"hi"]]]]]
