"""The cluster profile of docker-compose.yml run by real redis-servers (no Docker engine runs here)."""

from __future__ import annotations

import os
import random
import subprocess
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from harness.processes.services import wait_for
from tests.unit.test_compose import CLUSTER_NODES, REQUIRED, ROOT, shell_script


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert isinstance(data, dict)
    return data


def test_the_cluster_profiles_redis_made_locally(compose: dict[str, Any], tmp_path: Path) -> None:
    """The six nodes' compose command run by real redis-servers, then the create service's script.

    As in compose, each node listens on port 6379 of an address of its own: here a loopback address
    (127.x.y.2 ... .7, x and y random so parallel runs do not meet), with what Docker's network would
    give it put in: the address it binds, connects from and announces, and a `getent` answering for
    the `redis-node-N` names. The script makes 3 masters with a replica each; run again, it exits 0
    and leaves the cluster as it is. The nodes answer only with the password.
    """
    net = f"127.{random.randint(1, 254)}.{random.randint(1, 254)}"
    address = {node: f"{net}.{i + 2}" for i, node in enumerate(CLUSTER_NODES)}
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    getent = bin_dir / "getent"
    getent.write_text(f'#!/bin/sh\nn="${{2#redis-node-}}"\necho "{net}.$((n + 1))      $2"\n')
    getent.chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "REDISCLI_AUTH": REQUIRED["REDIS_PASSWORD"]}
    node_script = shell_script(compose, "redis-node-1")
    procs: list[subprocess.Popen[bytes]] = []
    clients: list[redis.Redis] = []
    try:
        for node, ip in address.items():
            (tmp_path / node).mkdir()
            script = node_script.replace('"$(hostname)"', ip)
            script = script.replace("--port 6379", f"--port 6379 --bind {ip} --bind-source-addr {ip}")
            with (tmp_path / node / "log").open("wb") as log:
                procs.append(
                    subprocess.Popen(
                        ["sh", "-c", script], cwd=tmp_path / node, env=env, stdout=log, stderr=log
                    )
                )
        clients += [redis.Redis(host=ip, password=REQUIRED["REDIS_PASSWORD"]) for ip in address.values()]

        def all_answer() -> bool:
            assert all(p.poll() is None for p in procs), (tmp_path / "redis-node-1" / "log").read_text()
            try:
                return all(c.ping() for c in clients)
            except redis.ConnectionError:
                return False

        wait_for(all_answer, 10, "the six nodes to answer")
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(host=address["redis-node-1"]).ping()

        create = shell_script(compose, "redis_cluster_create").replace("-h redis-node-1", f"-h {net}.2")
        made = subprocess.run(["sh", "-c", create], env=env, capture_output=True, text=True, timeout=60)
        assert made.returncode == 0, made.stdout + made.stderr
        assert "All 16384 slots covered" in made.stdout
        info = clients[0].cluster("info")
        assert info["cluster_state"] == "ok" and int(info["cluster_size"]) == 3  # masters serving slots

        def three_replicas() -> bool:
            roles = [node["flags"] for node in clients[0].cluster("nodes").values()]
            return sum("slave" in flags for flags in roles) == 3

        wait_for(three_replicas, 10, "three of the nodes to become replicas")
        again = subprocess.run(["sh", "-c", create], env=env, capture_output=True, text=True, timeout=30)
        assert again.returncode == 0 and "cluster already made" in again.stdout, again.stdout + again.stderr
    finally:
        for client in clients:
            client.close()
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=10)
