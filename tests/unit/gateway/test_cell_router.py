"""The cell router's choice, from hand-built prompts and loads (no Redis): prefix affinity while loads
are near, least load when they are not, round-robin among equals, and dead cells forgotten."""

from __future__ import annotations

from collections import Counter

from gateway.cell_router import CellRouter
from gateway.prefix_index import BLOCK_TOKENS, PrefixIndex, prompt_hashes

SHARED = list(range(1000, 1000 + 4 * BLOCK_TOKENS))  # a 4-block system prompt


def prompt(tail: int, shared: list[int] = SHARED) -> list[int]:
    return shared + [tail] * BLOCK_TOKENS


def test_hashes_chain_on_the_prefix_and_skip_a_partial_block() -> None:
    a = prompt_hashes(prompt(1))
    assert len(a) == 5 and len(prompt_hashes(prompt(1)[:-1])) == 4
    assert prompt_hashes(prompt(2))[:4] == a[:4] and prompt_hashes(prompt(2))[4] != a[4]
    # Equal blocks after different prefixes differ: a hash names the whole prefix.
    other = prompt_hashes(list(range(5000, 5000 + 4 * BLOCK_TOKENS)) + [1] * BLOCK_TOKENS)
    assert other[4] != a[4]


def test_index_matches_leading_blocks_and_drops_the_least_recently_placed() -> None:
    index = PrefixIndex(capacity=6)
    index.add(prompt_hashes(prompt(1)))
    assert index.matched(prompt_hashes(prompt(2))) == 4
    assert index.matched(prompt_hashes(prompt(1))) == 5
    index.add(prompt_hashes([7] * 2 * BLOCK_TOKENS))  # 2 more blocks: the oldest one goes
    assert len(index) == 6 and index.matched(prompt_hashes(prompt(1))) == 0


def test_a_shared_prefix_follows_its_cell_until_the_load_gap_outweighs_it() -> None:
    router = CellRouter(["a", "b"], "cache_aware", prefix_weight=4.0)
    first = router.choose({"a": 0, "b": 0}, prompt(1))
    other = "b" if first == "a" else "a"
    assert router.choose({first: 3, other: 0}, prompt(2)) == first  # 3 - 4 x 4/5 < 0
    assert router.choose({first: 4, other: 0}, prompt(3)) == other  # 4 - 3.2 > 0


def test_an_adapters_prompts_match_only_what_that_adapter_was_sent() -> None:
    """Hashed as the batcher's prefix cache hashes them (batcher/core/kv/prefix_cache.py)."""
    from batcher.core.kv.prefix_cache import block_hashes
    from batcher.core.request import Request
    from common.protocol import LoRARequest, SamplingParams

    adapter = LoRARequest(lora_name="sql", lora_path="/adapters/sql")
    req = Request("r", prompt(1), SamplingParams(), 0.0, "", lora_request=adapter)
    assert prompt_hashes(prompt(1), BLOCK_TOKENS, adapter.cache_key) == block_hashes(req, BLOCK_TOKENS)
    router = CellRouter(["a", "b"], "cache_aware", prefix_weight=4.0)
    first = router.choose({"a": 0, "b": 0}, prompt(1), extra_keys=adapter.cache_key)
    other = "b" if first == "a" else "a"
    assert router.choose({first: 3, other: 0}, prompt(2), extra_keys=adapter.cache_key) == first
    assert router.choose({first: 1, other: 0}, prompt(2)) == other  # the base model's: no match


def test_unrelated_prompts_spread_by_load_and_round_robin() -> None:
    router = CellRouter(["a", "b"], "cache_aware")
    placed = Counter(router.choose({"a": 0, "b": 0}, [i] * 3 * BLOCK_TOKENS) for i in range(10))
    assert placed == Counter({"a": 5, "b": 5})
    assert router.choose({"a": 2, "b": 1}, [99] * BLOCK_TOKENS) == "b"


def test_least_load_ignores_prefixes_and_random_uses_every_live_cell() -> None:
    least = CellRouter(["a", "b"], "least_load", prefix_weight=4.0)
    assert least.choose({"a": 0, "b": 1}, prompt(1)) == "a"
    assert least.choose({"a": 1, "b": 0}, prompt(1)) == "b"
    rand = CellRouter(["a", "b", "c"], "random")
    placed = {rand.choose({"a": 5, "b": 0, "c": None}, prompt(1)) for _ in range(200)}
    assert placed == {"a", "b"}


def test_a_dead_cell_gets_nothing_and_comes_back_without_its_prefixes() -> None:
    router = CellRouter(["a", "b"], "cache_aware")
    assert router.choose({"a": 0, "b": None}, prompt(1)) == "a"
    assert router.choose({"a": None, "b": 9}, prompt(1)) == "b"
    assert len(router.indexes["a"]) == 0  # dropped when seen dead
    # Back, a's empty cache no longer outbids b, which now holds the prompt.
    assert router.choose({"a": 0, "b": 1}, prompt(2)) == "b"
    assert router.choose({"a": None, "b": None}, prompt(1)) == "a"  # none live: the first cell


def test_a_cell_is_matched_in_the_block_size_its_workers_announce() -> None:
    router = CellRouter(["a", "b"])
    router.block_tokens = {"a": 4, "b": 4}  # as place() reads it from each cell's WorkerInfo
    shared = list(range(100, 108))  # two 4-token blocks: less than one block of the default size
    first = router.choose({"a": 0, "b": 0}, [*shared, 1, 1, 1, 1])
    other = "b" if first == "a" else "a"
    assert router.choose({first: 1, other: 0}, [*shared, 2, 2, 2, 2]) == first  # 1 - 4 x 2/3 < 0
    router.choose({first: None, other: 0}, shared)  # seen dead: its index and block size forgotten
    assert first not in router.block_tokens


def test_a_prompt_cache_key_follows_its_cell_until_the_load_gap_outweighs_it() -> None:
    router = CellRouter(["a", "b"], "cache_aware", prefix_weight=4.0)
    key = "alice\0conversation-7"

    def fresh(n: int) -> list[int]:  # a prompt sharing no block with any other: only the key can match
        return prompt(n, shared=[n] * BLOCK_TOKENS)

    first = router.choose({"a": 0, "b": 0}, fresh(1), key)
    other = "b" if first == "a" else "a"
    assert router.choose({first: 3, other: 0}, fresh(2), key) == first  # 3 - 4 < 0
    assert router.choose({first: 5, other: 0}, fresh(3), key) == other  # 5 - 4 > 0
    # That placement moved the key: it follows its latest cell. Another API key's same key is not it.
    assert router.choose({first: 0, other: 3}, fresh(4), key) == other
    assert router.choose({first: 0, other: 3}, fresh(5), "bob\0conversation-7") == first
    # Least-load placement keeps no keys.
    plain = CellRouter(["a", "b"], "least_load")
    plain.choose({"a": 0, "b": 0}, fresh(6), "k")
    assert plain.choose({"a": 1, "b": 0}, fresh(7), "k") == "b"
