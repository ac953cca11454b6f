"""Control-plane cost with several cells on one machine: `control_plane --cells N --workers-per-cell W`.

One redis-server holds every cell (the keys carry the cell's hash tag, which only a cluster needs);
each cell gets a batcher (`CBSERVE_CELL`) and W workers with WORKER_NULL_MODEL=true (they load the
model's config and its tiny weights, never run them); `--gateways G` gateways each place requests in
all cells (`GATEWAY_CELLS`); two by default: the gateway is the costliest process per token and
one Python process uses one core, and more than one gateway placing in the same cells is how a
cluster runs. The client sends B requests per worker (N x W x B in all, dealt over the gateways, a
cell's worth (at least 256) at a time) and measures the window in which every request is placed and none has
finished, so each worker steps with its full batch.

With ~N x W + N + G + 1 busy processes on a few cores, wall-clock rates measure the contention, not
the processes: the report is CPU time (user + system, /proc) per step and per token, and how busy
the machine was (its CPU over the window's wall time). Per cell: the batcher's and the cell's workers'
CPU. The gateways and Redis serve every cell, so their CPU is one figure per token for all cells.
"""

from __future__ import annotations

import asyncio
import functools
import os
import resource
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import redis
import redis.asyncio as aioredis

from benchmarks.load.systems import (
    CLOCK_TICKS_PER_S,
    ProcessGroup,
    cpu_seconds,
    free_port,
    http_ok,
    start_redis,
    wait_until,
)
from common import streams

PROMPT = [7, 8, 9, 10]
# 32 workers importing torch at once on 2 cores take minutes to join.
STARTUP_TIMEOUT_S = 900.0


def _machine_cpu_s() -> float:
    """Non-idle CPU seconds of the whole machine so far, every process's (Linux /proc/stat)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / CLOCK_TICKS_PER_S


def _pss_mib(group: ProcessGroup) -> float:
    """Memory of the group's processes, summed (MiB): proportional set size, so the pages the
    workers share (the Python and torch libraries) count once, not once per worker."""
    total_kib = 0
    for proc in group.procs.values():
        try:
            rollup = Path(f"/proc/{proc.pid}/smaps_rollup").read_text()
        except OSError:
            continue
        line = next((x for x in rollup.splitlines() if x.startswith("Pss:")), "Pss: 0 kB")
        total_kib += int(line.split()[1])
    return total_kib / 1024


def _client_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _cell_stats(client: redis.Redis, cells: list[str]) -> dict[str, dict[str, float]]:
    stats = {}
    for cell in cells:
        raw: Any = client.hgetall(streams.cell_keys(cell).stats)
        stats[cell] = {k.decode(): float(v) for k, v in raw.items() if not k.startswith(b"num_steps:")}
    return stats


def start_cells(
    group: ProcessGroup, model: str, cells: list[str], workers_per_cell: int, gateway_ports: list[int]
) -> str:
    """redis-server, per cell a batcher and its workers, then the gateways; ready once all joined."""
    redis_url = start_redis(group)
    client = redis.Redis.from_url(redis_url)
    for cell in cells:
        env = {"REDIS_URL": redis_url, "CBSERVE_CELL": cell}
        group.spawn(f"{cell}-batcher", [sys.executable, "-m", "batcher"], env)
        worker = [sys.executable, "-m", "gpu_worker", "--model", model, "--device", "cpu"]
        for i in range(workers_per_cell):
            group.spawn(f"{cell}-worker{i}", worker, env)
    front = {"REDIS_URL": redis_url, "CBSERVE_CELL": cells[0], "GATEWAY_CELLS": ",".join(cells)}
    for g, port in enumerate(gateway_ports):
        argv = [sys.executable, "-m", "gateway", "--host", "127.0.0.1", "--port", str(port), "--model", model]
        group.spawn(f"gateway{g}", argv, front)

    def all_joined() -> bool:
        stats = _cell_stats(client, cells)
        return all(stats[c].get("num_workers", 0) >= workers_per_cell for c in cells)

    for port in gateway_ports:
        url = f"http://127.0.0.1:{port}/health"
        wait_until(functools.partial(http_ok, url), STARTUP_TIMEOUT_S, url, group)
    wait_until(all_joined, STARTUP_TIMEOUT_S, "every cell's workers to join its batcher", group)
    client.close()
    return redis_url


async def _held(client: aioredis.Redis, cells: list[str]) -> float:
    """Requests the cells' batchers hold (waiting or running) plus all they ever finished."""
    total = 0.0
    for cell in cells:
        fields = ["num_waiting", "num_running", "num_finished"]
        raw: Any = await client.hmget(streams.cell_keys(cell).stats, fields)
        total += sum(float(v or 0) for v in raw)
    return total


async def _finished(client: aioredis.Redis, cells: list[str]) -> float:
    raw: Any = [await client.hget(streams.cell_keys(c).stats, "num_finished") for c in cells]
    return sum(float(v or 0) for v in raw)


def _any_failed(tasks: list[asyncio.Task[httpx.Response]]) -> bool:
    return any(t.done() and (t.exception() or t.result().status_code != 200) for t in tasks)


@dataclass(frozen=True)
class Snapshot:
    """Counters at one moment of the load: CPU seconds by process, machine, client; the cells' stats."""

    t: float
    cpu: dict[str, float]
    machine_s: float
    client_s: float
    stats: dict[str, dict[str, float]]


async def _load(
    base_urls: list[str],
    redis_url: str,
    cells: list[str],
    num_requests: int,
    output_len: int,
    wave: int,
    snap: Callable[[], Snapshot],
) -> tuple[float, Snapshot, Snapshot]:
    """`num_requests` completions, dealt round-robin over the gateways: the load's wall seconds and
    snapshots at the start and end of its steady window (every request placed, none finished).

    They are sent `wave` at a time, the next wave once the batchers hold the last: a gateway places a
    request with one stats read per cell, and 2048 at once once drew 503s from a gateway (its Redis
    calls failing; not diagnosed) and otherwise left the batches filling for most of the load.
    """
    body = _body(output_len)
    clients = _clients(base_urls)
    tasks: list[asyncio.Task[httpx.Response]] = []
    stats = aioredis.Redis.from_url(redis_url)

    async def wait_for(condition: Callable[[float], bool], what: str) -> None:
        deadline = time.monotonic() + 300
        while not condition(await _held(stats, cells)) and not _any_failed(tasks):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not within 300 s")
            await asyncio.sleep(0.05)  # polling a condition, with the deadline above

    try:
        held_before, finished_before = await _held(stats, cells), await _finished(stats, cells)
        start = time.perf_counter()
        for first in range(0, num_requests, wave):
            for i in range(first, min(first + wave, num_requests)):
                post = clients[i % len(clients)].post("/v1/completions", json=body)
                tasks.append(asyncio.create_task(post))
            await wait_for(lambda held: held - held_before >= len(tasks), f"{len(tasks)} requests placed")
        window_start = snap()
        # The client's view, not the stats: those count a finish a batcher pass late.
        if done := sum(t.done() for t in tasks):
            raise RuntimeError(
                f"{done} requests finished before the last was placed: no window with every request "
                "running; raise --output-len (or use fewer workers: placing them took too long)"
            )
        deadline = time.monotonic() + 300
        while not any(t.done() for t in tasks):
            if time.monotonic() > deadline:
                raise TimeoutError("no request finished within 300 s")
            await asyncio.sleep(0.05)
        window_end = snap()
        _check_responses(await asyncio.gather(*tasks))
        elapsed = time.perf_counter() - start
        await _counted(stats, cells, finished_before + num_requests)
    finally:
        for t in tasks:
            t.cancel()
        for c in clients:
            await c.aclose()
        await stats.aclose()
    return elapsed, window_start, window_end


async def _warm_up(redis_url: str, base_urls: list[str], cells: list[str], num_requests: int) -> None:
    """Connections and first allocations: requests of 40 tokens over every gateway, each to its end.
    No window is measured, so none needs every request running at once (on a loaded machine one
    could finish before the last was placed)."""
    body = _body(40)
    clients = _clients(base_urls)
    stats = aioredis.Redis.from_url(redis_url)
    try:
        finished_before = await _finished(stats, cells)
        posts = (clients[i % len(clients)].post("/v1/completions", json=body) for i in range(num_requests))
        _check_responses(await asyncio.gather(*posts))
        await _counted(stats, cells, finished_before + num_requests)
    finally:
        for c in clients:
            await c.aclose()
        await stats.aclose()


async def _counted(stats: aioredis.Redis, cells: list[str], num_finished: float) -> None:
    """Wait until the cells' stats count `num_finished` finished requests: they count a finish a
    batcher pass late, and the next load's "none finished yet" relies on it."""
    deadline = time.monotonic() + 60
    while await _finished(stats, cells) < num_finished:
        if time.monotonic() > deadline:
            raise TimeoutError("the cells' stats did not count every finished request within 60 s")
        await asyncio.sleep(0.05)  # polling a condition, with the deadline above


def _body(output_len: int) -> dict[str, Any]:
    return {"prompt": PROMPT, "max_tokens": output_len, "temperature": 0, "ignore_eos": True}


def _clients(base_urls: list[str]) -> list[httpx.AsyncClient]:
    """One client per gateway. No connection reuse: a gateway closes an idle one after
    GATEWAY_KEEP_ALIVE_S, and a request sent on it as it closes fails with ReadError (a later wave's
    did, on the contended 2-core host)."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    return [httpx.AsyncClient(base_url=u, timeout=900, limits=limits) for u in base_urls]


def _check_responses(responses: list[httpx.Response]) -> None:
    failed = [r for r in responses if r.status_code != 200]
    if failed:  # say why: an overloaded machine shows here first (timeouts, queue_timeout)
        first = failed[0].text[:500]
        raise RuntimeError(f"{len(failed)} of {len(responses)} requests failed; first: {first}")


def measure_cells(
    model: str,
    num_cells: int,
    workers_per_cell: int,
    num_gateways: int,
    batch_size: int,
    output_len: int,
    async_scheduling: bool,
    log_dir: Path,
) -> dict[str, Any]:
    cells = [f"cell{i}" for i in range(num_cells)]
    block_size = 16
    env = {
        "WORKER_NULL_MODEL": "true",
        "WORKER_NUM_THREADS": "1",
        "WORKER_MAX_NUM_SEQS": str(batch_size),
        "WORKER_MAX_NUM_BATCHED_TOKENS": str(max(batch_size * len(PROMPT), 64)),
        # Room for a full batch of whole requests, no more: 32 workers each with a default pool add up.
        "WORKER_NUM_BLOCKS": str(batch_size * (-(-(len(PROMPT) + output_len) // block_size) + 1)),
        "BATCHER_ASYNC_SCHEDULING": "true" if async_scheduling else "false",
        # A gateway busy relaying a thousand requests' tokens on a shared core can take longer than
        # the default 10 s to read a new request's headers; it then closes the socket (one run failed so).
        "GATEWAY_HEADER_TIMEOUT_S": "120",
        "GATEWAY_BODY_TIMEOUT_S": "120",
    }
    mode = "async" if async_scheduling else "sync"
    group = ProcessGroup(f"cells{num_cells}x{workers_per_cell}-b{batch_size}-{mode}", log_dir, env)
    ports = [free_port() for _ in range(num_gateways)]
    base_urls = [f"http://127.0.0.1:{p}" for p in ports]
    num_requests = num_cells * workers_per_cell * batch_size
    # A cell's worth of requests at a time, at least 256 (a burst that size placed fine here).
    wave = max(workers_per_cell * batch_size, 256)
    try:
        startup = time.perf_counter()
        redis_url = start_cells(group, model, cells, workers_per_cell, ports)
        startup_s = time.perf_counter() - startup
        client = redis.Redis.from_url(redis_url)

        def snap() -> Snapshot:
            stats = _cell_stats(client, cells)
            return Snapshot(time.perf_counter(), cpu_seconds(group), _machine_cpu_s(), _client_cpu_s(), stats)

        asyncio.run(_warm_up(redis_url, base_urls, cells, 2 * num_cells * num_gateways))
        load_before = os.getloadavg()
        elapsed, w0, w1 = asyncio.run(
            _load(base_urls, redis_url, cells, num_requests, output_len, wave, snap)
        )
        pss_mib = _pss_mib(group)
        client.close()
    finally:
        group.stop()
    window_s = w1.t - w0.t
    cpu = {name: w1.cpu[name] - s for name, s in w0.cpu.items() if name in w1.cpu}
    rows: list[dict[str, Any]] = []
    for cell in cells:
        steps = w1.stats[cell]["num_steps"] - w0.stats[cell]["num_steps"]
        running = w0.stats[cell]["num_running"]
        # In the window every running request decodes one token per step of its worker.
        tokens = steps * running / workers_per_cell
        if steps <= 0 or running <= 0:
            raise RuntimeError(
                f"{cell}: no steady window (steps {steps}, running {running}); raise --output-len"
            )
        batcher = cpu[f"{cell}-batcher"]
        workers = sum(s for name, s in cpu.items() if name.startswith(f"{cell}-worker"))
        rows.append(
            {
                "cell": cell,
                "running": int(running),
                "tokens": tokens,
                "steps": int(steps),
                "mean_batch": running / workers_per_cell,
                "steps_per_s_per_worker": steps / workers_per_cell / window_s,
                "batcher_ms_per_step": 1000 * batcher / steps,
                "batcher_us_per_token": 1e6 * batcher / tokens,
                "worker_ms_per_step": 1000 * workers / steps,
                "worker_us_per_token": 1e6 * workers / tokens,
            }
        )
    steps = sum(r["steps"] for r in rows)
    tokens = sum(r["tokens"] for r in rows)
    gateways = sum(s for name, s in cpu.items() if name.startswith("gateway"))
    ours = sum(cpu.values())
    return {
        "null_model": True,
        "cells": num_cells,
        "workers_per_cell": workers_per_cell,
        "gateways": num_gateways,
        "batch_size": batch_size,
        "async_scheduling": async_scheduling,
        "output_len": output_len,
        "requests": num_requests,
        "tokens": tokens,
        "steps": steps,
        "wall_s": elapsed,
        "window_s": window_s,
        "startup_s": startup_s,
        "by_cell": rows,
        "totals": {
            "steps_per_s_per_worker": steps / (num_cells * workers_per_cell) / window_s,
            "batcher_ms_per_step": 1000 * sum(cpu[f"{c}-batcher"] for c in cells) / steps,
            "worker_ms_per_step": 1000 * sum(v for n, v in cpu.items() if "-worker" in n) / steps,
            "gateway_ms_per_step": 1000 * gateways / steps,
            "redis_ms_per_step": 1000 * cpu["redis"] / steps,
            "gateway_us_per_token": 1e6 * gateways / tokens,
            "redis_us_per_token": 1e6 * cpu["redis"] / tokens,
            "gateway_cpu_s": {n: v for n, v in cpu.items() if n.startswith("gateway")},
        },
        # How contended the wall-clock figures are: CPU over the window's wall time, in cores.
        "busy": {
            "cores": os.cpu_count() or 1,
            "pipeline_cores": ours / window_s,
            "client_cores": (w1.client_s - w0.client_s) / window_s,
            "machine_cores": (w1.machine_s - w0.machine_s) / window_s,
            "loadavg_before": load_before[0],
            "loadavg_after": os.getloadavg()[0],
            "pss_mib": pss_mib,
        },
    }


def print_report(r: dict[str, Any]) -> None:
    mode = "async" if r["async_scheduling"] else "sync"
    print(
        f"{r['cells']} cells x {r['workers_per_cell']} null workers, {r['gateways']} gateway(s), batch "
        f"{r['batch_size']} per worker ({r['requests']} requests x {r['output_len']} tokens), {mode}; "
        f"startup {r['startup_s']:.0f} s, load {r['wall_s']:.1f} s, of it {r['window_s']:.1f} s with "
        "every request running and none finished (the window measured below)"
    )
    columns = [("cell", 6), ("run", 5), ("steps", 6), ("batch", 5), ("steps/s/wkr", 11)]
    columns += [("batcher ms/step", 15), ("us/tok", 7), ("worker ms/step", 14), ("us/tok", 7)]
    print(" ".join(f"{name:>{width}}" for name, width in columns))
    for c in r["by_cell"]:
        print(
            f"{c['cell']:>6} {c['running']:>5} {c['steps']:>6} {c['mean_batch']:>5.1f} "
            f"{c['steps_per_s_per_worker']:>11.1f} {c['batcher_ms_per_step']:>15.3f} "
            f"{c['batcher_us_per_token']:>7.1f} {c['worker_ms_per_step']:>14.3f} "
            f"{c['worker_us_per_token']:>7.1f}"
        )
    t = r["totals"]
    print(
        f"{'all':>6} {sum(c['running'] for c in r['by_cell']):>5} {r['steps']:>6} "
        f"{r['tokens'] / r['steps']:>5.1f} "
        f"{t['steps_per_s_per_worker']:>11.1f} {t['batcher_ms_per_step']:>15.3f} "
        f"{1000 * t['batcher_ms_per_step'] * r['steps'] / r['tokens']:>7.1f} "
        f"{t['worker_ms_per_step']:>14.3f} {1000 * t['worker_ms_per_step'] * r['steps'] / r['tokens']:>7.1f}"
    )
    print(
        f"shared by every cell, per step / per token: gateways {t['gateway_ms_per_step']:.3f} ms / "
        f"{t['gateway_us_per_token']:.1f} us, redis {t['redis_ms_per_step']:.3f} ms / "
        f"{t['redis_us_per_token']:.1f} us"
    )
    b = r["busy"]
    print(
        f"machine: {b['machine_cores']:.2f} of {b['cores']} cores busy in the window (pipeline "
        f"{b['pipeline_cores']:.2f}, client {b['client_cores']:.2f}, the rest other work); load average "
        f"{b['loadavg_before']:.1f} -> {b['loadavg_after']:.1f}; pipeline PSS {b['pss_mib']:.0f} MiB"
    )
