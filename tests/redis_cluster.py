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

from tests.conftest import free_port
from tests.services import wait_for

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
        return [redis.Redis(port=port) for port in self.ports]

    def errorstats(self) -> dict[int, dict[str, object]]:
        """Each node's `INFO errorstats` (error name -> counts), by port."""
        return {
            node.connection_pool.connection_kwargs["port"]: node.info("errorstats") for node in self.nodes()
        }


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
        yield cluster
    finally:
        for proc in cluster.procs:
            proc.kill()
        for proc in cluster.procs:
            proc.wait()
