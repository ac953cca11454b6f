"""A real local Redis Cluster for tests: 3 masters and 3 replicas on free ports, made with
`redis-cli --cluster create`, ready once every node says `cluster_state:ok`."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import redis

from common.redis_io.redis_conn import as_str
from harness.processes.redis_server import free_port
from harness.processes.services import wait_for

NUM_NODES = 6  # 3 masters, each with one replica


@dataclass
class RedisCluster:
    ports: list[int]
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def url(self) -> str:
        """REDIS_URL of the cluster (with REDIS_CLUSTER=true): every node, comma-separated."""
        return "redis://" + ",".join(f"127.0.0.1:{port}" for port in self.ports) + "/0"

    def nodes(self) -> list[redis.Redis]:
        """A client of each node still running."""
        return [redis.Redis(port=port) for port in self.live_ports()]

    def live_ports(self) -> list[int]:
        return [port for port, proc in zip(self.ports, self.procs, strict=True) if proc.poll() is None]

    def master_of(self, key: str) -> int:
        """The port of the master that serves `key`'s slot, as a live node sees the cluster now."""
        node = redis.Redis(port=self.live_ports()[0], socket_timeout=2)
        slot = int(node.execute_command("CLUSTER", "KEYSLOT", key))
        for entry in _cluster_nodes(node):
            if "master" in entry.flags and "fail" not in entry.flags and entry.serves(slot):
                return entry.port
        raise LookupError(f"no live master serves slot {slot}")

    def replica_of(self, master_port: int) -> int:
        """The port of the (one) replica of the master on `master_port`."""
        nodes = _cluster_nodes(redis.Redis(port=master_port, socket_timeout=2))
        master_id = next(e.node_id for e in nodes if e.port == master_port)
        return next(e.port for e in nodes if e.master_id == master_id)

    def proc(self, port: int) -> subprocess.Popen[bytes]:
        return self.procs[self.ports.index(port)]

    def kill(self, port: int) -> None:
        """SIGKILL the node on `port` (no shutdown, no last words to its replica)."""
        self.proc(port).kill()
        self.proc(port).wait()

    def is_master(self, port: int) -> bool:
        """The node on `port` is a master, and the cluster, as it sees it, serves every slot."""
        try:
            node = redis.Redis(port=port, socket_timeout=1)
            role = node.execute_command("ROLE")[0]
            return as_str(role) == "master" and _cluster_ok(port)
        except redis.RedisError:
            return False

    def errorstats(self) -> dict[int, dict[str, object]]:
        """Each node's `INFO errorstats` (error name -> counts), by port."""
        return {
            node.connection_pool.connection_kwargs["port"]: node.info("errorstats") for node in self.nodes()
        }


@dataclass(frozen=True)
class NodeEntry:
    """One line of CLUSTER NODES."""

    node_id: str
    port: int
    flags: frozenset[str]
    master_id: str  # "-" for a master
    slots: tuple[tuple[int, int], ...]

    def serves(self, slot: int) -> bool:
        return any(lo <= slot <= hi for lo, hi in self.slots)


def _cluster_nodes(node: redis.Redis) -> list[NodeEntry]:
    text = as_str(node.execute_command("CLUSTER", "NODES"))
    entries = []
    for line in text.strip().splitlines():
        node_id, addr, flags, master_id, *_rest = line.split()
        slots = []
        for part in line.split()[8:]:
            if part.startswith("["):  # a slot being migrated: none here
                continue
            lo, _, hi = part.partition("-")
            slots.append((int(lo), int(hi or lo)))
        port = int(addr.split("@")[0].rpartition(":")[2])
        entries.append(NodeEntry(node_id, port, frozenset(flags.split(",")), master_id, tuple(slots)))
    return entries


def assert_no_crossslot(cluster: RedisCluster) -> None:
    """Fail when any node answered a command with CROSSSLOT (its keys in more than one slot)."""
    errors = {port: stats for port, stats in cluster.errorstats().items() if "errorstat_CROSSSLOT" in stats}
    assert not errors, f"CROSSSLOT errors on nodes: {errors}"


def _answers(port: int) -> bool:
    try:
        return bool(redis.Redis(port=port, socket_timeout=1).ping())
    except redis.ConnectionError:
        return False


def _cluster_ok(port: int) -> bool:
    info = redis.Redis(port=port, socket_timeout=1).execute_command("CLUSTER", "INFO")
    text = info.decode() if isinstance(info, bytes) else str(info)
    return "cluster_state:ok" in text


def _synced(port: int) -> bool:
    """A master, or a replica whose link to its master is up."""
    info = redis.Redis(port=port, socket_timeout=1).info("replication")
    return info.get("role") == "master" or info.get("master_link_status") == "up"


@contextlib.contextmanager
def redis_cluster(data_dir: Path, timeout_s: float = 30.0) -> Iterator[RedisCluster]:
    """Start the nodes, create the cluster, wait until every node serves every slot; kill them after."""
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    assert server and cli, "redis-server and redis-cli must be on PATH"
    cluster = RedisCluster(ports=[free_port() for _ in range(NUM_NODES)])
    try:
        for port in cluster.ports:
            node_dir = data_dir / f"node-{port}"
            node_dir.mkdir(parents=True, exist_ok=True)
            args = ["--port", str(port), "--bind", "127.0.0.1", "--dir", str(node_dir), "--save", ""]
            args += ["--appendonly", "no", "--cluster-enabled", "yes", "--cluster-node-timeout", "2000"]
            # Replicas sync at once (Redis waits 5 s by default to batch diskless syncs).
            args += ["--repl-diskless-sync-delay", "0"]
            # A bus port of its own: the default (port + 10000) fails for ports above 55535.
            args += ["--cluster-port", str(free_port())]
            log = open(node_dir / "redis.log", "wb")  # noqa: SIM115 - closed with the process
            cluster.procs.append(subprocess.Popen([server, *args], stdout=log, stderr=log))
        for port in cluster.ports:
            wait_for(lambda port=port: _answers(port), timeout_s, f"redis node {port} to answer PING")
        nodes = [f"127.0.0.1:{port}" for port in cluster.ports]
        subprocess.run(
            [cli, "--cluster", "create", *nodes, "--cluster-replicas", "1", "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=timeout_s,
        )
        for port in cluster.ports:
            wait_for(
                lambda port=port: _cluster_ok(port), timeout_s, f"node {port} to report cluster_state:ok"
            )
        # A replica that never synced refuses to take over its master: a test that kills a master
        # right after start would wait for a failover that cannot happen.
        for port in cluster.ports:
            wait_for(lambda port=port: _synced(port), timeout_s, f"node {port}'s replication link")
        yield cluster
    finally:
        for proc in cluster.procs:
            proc.kill()
        for proc in cluster.procs:
            proc.wait()
