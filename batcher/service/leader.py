"""Active or standby: a batcher process schedules only while it leads (leadership.py).

Any number of batcher processes may run; one holds the lease and serves, the others poll for it.
Each time a process takes the lease it builds a fresh `Batcher`, which rebuilds its state from Redis
(recovery.py); a process that loses the lease drops all its state and stands by again.

A Redis outage (restart, crash, network, a cluster master's failover) is handled like a takeover:
the batcher drops its state, waits with backoff until Redis answers for its cell's slot, takes the
lease again (its own lease, if Redis kept it, with a new epoch) and rebuilds from Redis. Keeping the
in-memory state instead would be wrong after a Redis killed with AOF everysec, or a master failover
(replication is asynchronous): up to a second of writes (token events, step results, acks, step
messages) may be gone, so the scheduler's view and Redis no longer agree; rebuilding makes Redis,
as it came back, the truth again, and fencing the workers drops whatever they held.
"""

from __future__ import annotations

import contextlib
import logging
import threading

import redis

from batcher.service.leadership import Leadership, LeadershipLost, current_leader
from batcher.service.loop import Batcher
from batcher.settings import BatcherSettings
from common.redis_io.redis_refusal import refuses_writes
from common.redis_io.retry import REDIS_DOWN, Backoff, wait_for_redis
from common.streams import cell_keys

log = logging.getLogger("batcher")


def serve(settings: BatcherSettings, client: redis.Redis, stop: threading.Event) -> None:
    leadership = Leadership(client, settings.batcher_id, settings.lease_ttl_s, settings.cell)
    waiting_logged = False
    after_outage = False  # the next leader term must fence and rebuild even at epoch 1
    refusal_backoff = Backoff(max_s=settings.standby_poll_s * 4)
    refusal_logged = False
    try:
        while not stop.is_set():
            try:
                if not leadership.acquire(reclaim=after_outage):
                    if not waiting_logged:
                        log.info(
                            "batcher %s on standby; active: %s",
                            settings.batcher_id,
                            current_leader(client, settings.cell),
                        )
                        waiting_logged = True
                    stop.wait(settings.standby_poll_s)
                    continue
                waiting_logged = False
                if refusal_logged:
                    log.info("redis takes writes again")
                refusal_logged = False
                refusal_backoff.reset()
                log.info("batcher %s took the leadership (epoch %d)", settings.batcher_id, leadership.epoch)
                batcher = Batcher(settings, client, leadership, after_outage=after_outage)
                after_outage = False
                batcher.run(stop)
            except LeadershipLost as e:
                log.warning("%s: stepping down to standby", e)
            except redis.ResponseError as e:
                # Redis refuses writes (full, read-only) while this batcher takes the lease or builds
                # its state (a running batcher rides it out, loop.py): stand by, retry.
                if not refuses_writes(e):
                    raise
                if not refusal_logged:
                    log.warning("redis refuses writes (%s): retrying the leadership with backoff", e)
                    refusal_logged = True
                after_outage = after_outage or leadership.epoch > 0  # a state half built: fence, rebuild
                stop.wait(refusal_backoff.next_delay())
                continue
            except REDIS_DOWN as e:
                log.warning("redis unreachable (%s): state dropped, waiting to rebuild it", e)
                after_outage = True
                if not wait_for_redis(client, stop, key=cell_keys(settings.cell).lease):
                    break
                log.info("redis reachable again: recovering as on a takeover")
    finally:
        with contextlib.suppress(redis.exceptions.RedisError):
            leadership.release()
