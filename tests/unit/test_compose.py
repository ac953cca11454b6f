"""docker-compose.yml agrees with the real entry points (no Docker engine runs here to try it)."""

from __future__ import annotations

import importlib
import json
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from pydantic_settings import BaseSettings

from batcher.settings import BatcherSettings
from cbserve_celery.settings import CelerySettings
from common.models_config import load_models_config
from common.redis_io.redis_conn import cluster_nodes
from gateway.settings import GatewaySettings
from gpu_worker.settings import WorkerSettings

ROOT = Path(__file__).resolve().parents[2]
SETTINGS: dict[str, type[BaseSettings]] = {
    "gateway": GatewaySettings,
    "batcher": BatcherSettings,
    "gpu_worker": WorkerSettings,
}


# Variables compose must be given (`${VAR:?message}`); the tests set them as an operator would.
REQUIRED = {"REDIS_PASSWORD": "pw"}


def interpolate(value: str) -> str:
    """Compose's `${VAR:-default}` with nothing set: the default; `${VAR:?error}` from REQUIRED."""
    value = re.sub(r"\$\{([A-Z_]+):\?[^}]*\}", lambda m: REQUIRED[m.group(1)], value)
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", value)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert isinstance(data, dict)
    return data


def env_names(settings: type[BaseSettings]) -> set[str]:
    """Every environment variable a settings class reads."""
    prefix = str(settings.model_config.get("env_prefix", ""))
    names = set()
    for name, field in settings.model_fields.items():
        names.add(f"{prefix}{name}".upper())
        alias = field.validation_alias
        for choice in getattr(alias, "choices", []):
            if isinstance(choice, str) and choice.isupper():
                names.add(choice)
    return names


def test_file_follows_the_compose_specification(compose: dict[str, Any]) -> None:
    schema = json.loads((ROOT / "tests" / "schemas" / "compose_spec.json").read_text())
    errors = [f"{list(e.path)}: {e.message}" for e in jsonschema.Draft7Validator(schema).iter_errors(compose)]
    assert not errors, errors


def test_schema_check_catches_mistakes(compose: dict[str, Any]) -> None:
    schema = json.loads((ROOT / "tests" / "schemas" / "compose_spec.json").read_text())
    broken = json.loads(json.dumps(compose))
    broken["services"]["gateway"]["healthcheck"]["intervall"] = "10s"
    broken["services"]["batcher"]["depends_on"] = {"redis": {"condition": "when_ready"}}
    assert len(list(jsonschema.Draft7Validator(schema).iter_errors(broken))) == 2


def test_default_model_is_the_shipped_demo(compose: dict[str, Any]) -> None:
    for service in ("gateway", "gpu_worker"):
        model = interpolate(compose["services"][service]["environment"]["MODEL"])
        assert model == "/models/demo"
    assert any(
        interpolate(v).startswith("./models:/models") for v in compose["services"]["gateway"]["volumes"]
    )


def test_services_and_redis(compose: dict[str, Any]) -> None:
    services = compose["services"]
    plain = {
        name for name, spec in services.items() if not {"cluster", "models"} & set(spec.get("profiles", []))
    }
    assert plain == {"redis", "gateway", "batcher", "gpu_worker", "celery_worker"}
    redis = services["redis"]
    command = " ".join(redis["command"])
    assert "--appendonly yes" in command and "--requirepass" in command
    assert "ports" not in redis, "Redis must not be published to the host"
    assert "healthcheck" in redis


@pytest.mark.parametrize("service", list(SETTINGS))
def test_python_service_matches_its_entry_point(compose: dict[str, Any], service: str) -> None:
    spec = compose["services"][service]
    command = [interpolate(str(part)) for part in spec["command"]]
    assert command[:3] == ["python", "-m", service]
    # The arguments parse with the module's own parser.
    main = importlib.import_module(f"{service}.__main__")
    main.parse_args(command[3:])
    # Every variable set is one the service reads; REDIS_URL carries the password.
    env = {k: interpolate(str(v)) for k, v in spec["environment"].items()}
    unknown = set(env) - env_names(SETTINGS[service])
    assert not unknown, f"{service} sets variables it never reads: {unknown}"
    assert env["REDIS_URL"].startswith("redis://:") and "@redis:6379" in env["REDIS_URL"]
    assert spec["depends_on"]["redis"]["condition"] == "service_healthy"
    assert spec["healthcheck"]["test"][0] in {"CMD", "CMD-SHELL"}
    assert spec["build"] == "." and spec["image"] == compose["services"]["gateway"]["image"]


def test_batcher_settings_accept_compose_values(compose: dict[str, Any]) -> None:
    env = {k: interpolate(str(v)) for k, v in compose["services"]["batcher"]["environment"].items()}
    fields = {k.removeprefix("BATCHER_").lower(): v for k, v in env.items() if k.startswith("BATCHER_")}
    BatcherSettings(**fields)  # type: ignore[arg-type]
    healthcheck = compose["services"]["batcher"]["healthcheck"]["test"]
    assert healthcheck[1:4] == ["python", "-m", "batcher"]
    importlib.import_module("batcher.__main__").parse_args(healthcheck[4:])


def test_gpu_worker_reserves_a_gpu_and_checks_its_heartbeat_file(compose: dict[str, Any]) -> None:
    spec = compose["services"]["gpu_worker"]
    [device] = spec["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    assert "container_name" not in spec, "a fixed name would break --scale"
    assert "WORKER_WORKER_ID" not in spec["environment"], "a fixed id would break --scale"
    health_file = spec["environment"]["WORKER_HEALTH_FILE"]
    assert health_file in " ".join(spec["healthcheck"]["test"])


def test_gateway_is_the_only_published_service(compose: dict[str, Any]) -> None:
    published = [name for name, spec in compose["services"].items() if "ports" in spec]
    assert published == ["gateway", "cluster_gateway", "models_gateway"]
    # Closed by default: published on loopback only, unless GATEWAY_BIND names an interface.
    assert interpolate(compose["services"]["cluster_gateway"]["ports"][0]) == "127.0.0.1:8001:8000"
    [mapping] = compose["services"]["gateway"]["ports"]
    assert interpolate(mapping) == "127.0.0.1:8000:8000"
    port = shlex.split(" ".join(compose["services"]["gateway"]["command"]))
    assert port[port.index("--port") + 1] == "8000"
    assert "http://127.0.0.1:8000/health" in " ".join(compose["services"]["gateway"]["healthcheck"]["test"])


def test_celery_worker_runs_the_app_with_settings_it_reads(compose: dict[str, Any]) -> None:
    spec = compose["services"]["celery_worker"]
    assert spec["profiles"] == ["celery"], "opt-in: `docker compose up` starts the HTTP stack only"
    command = [interpolate(str(part)) for part in spec["command"]]
    assert command[:4] == ["celery", "-A", "cbserve_celery.worker", "worker"]
    assert command[command.index("--pool") + 1] == "threads"
    env = {k: interpolate(str(v)) for k, v in spec["environment"].items()}
    unknown = set(env) - env_names(CelerySettings)
    assert not unknown, f"celery_worker sets variables it never reads: {unknown}"
    assert env["REDIS_URL"] == interpolate(compose["services"]["gateway"]["environment"]["REDIS_URL"])
    fields = {
        k.removeprefix("CBSERVE_CELERY_").lower(): v for k, v in env.items() if k.startswith("CBSERVE_")
    }
    settings = CelerySettings(redis_url=env["REDIS_URL"], **fields)  # type: ignore[arg-type]
    assert settings.visibility_timeout_s <= 60  # a dead worker's task moves on within about a minute
    assert spec["depends_on"]["redis"]["condition"] == "service_healthy"
    assert "cbserve_celery.worker" in " ".join(spec["healthcheck"]["test"])
    assert spec["build"] == "." and spec["image"] == compose["services"]["gateway"]["image"]


def test_dockerfile_installs_every_service() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    for package in ("common", "openai_frontend", "gateway", "batcher", "gpu_worker", "cbserve_celery"):
        assert f"COPY {package} ./{package}" in dockerfile
    assert 'pip install ".[worker,gateway,celery]"' in dockerfile
    assert "pip install torch==" in dockerfile
    # The worker compiles its forward (inductor's C++ on the CPU, Triton's launcher on CUDA).
    assert "install -y --no-install-recommends g++" in dockerfile


def test_no_default_redis_password() -> None:
    """An unset REDIS_PASSWORD stops `docker compose up` with a message, never a known password."""
    text = (ROOT / "docker-compose.yml").read_text()
    uses = re.findall(r"\$\{REDIS_PASSWORD[^}]*\}", text)
    assert uses, "the services get the Redis password from REDIS_PASSWORD"
    assert all(use.startswith("${REDIS_PASSWORD:?") and len(use) > len("${REDIS_PASSWORD:?}") for use in uses)
    assert "change-me" not in text


# ----- profile `cluster`: two cells on a 6-node Redis Cluster ------------------------------------------
CLUSTER_NODES = [f"redis-node-{i}" for i in range(1, 7)]
CELL_SERVICES = ["cell_a_batcher", "cell_a_worker", "cell_b_batcher", "cell_b_worker"]
CLUSTER_APPS = [*CELL_SERVICES, "cluster_gateway"]


def service_env(compose: dict[str, Any], service: str) -> dict[str, str]:
    return {k: interpolate(str(v)) for k, v in compose["services"][service]["environment"].items()}


def test_cluster_profile_holds_the_cluster_and_two_cells_only(compose: dict[str, Any]) -> None:
    services = compose["services"]
    in_profile = {name for name, spec in services.items() if spec.get("profiles") == ["cluster"]}
    assert in_profile == {*CLUSTER_NODES, "redis_cluster_create", *CLUSTER_APPS}
    # Naming the gateway on `up` starts the whole profile: it depends on every cell's services.
    assert set(services["cluster_gateway"]["depends_on"]) == {"redis_cluster_create", *CELL_SERVICES}


def test_cluster_nodes_require_the_password_and_keep_their_data(compose: dict[str, Any]) -> None:
    volumes = set()
    for node in CLUSTER_NODES:
        spec = compose["services"][node]
        command = " ".join(spec["command"])
        assert spec["image"] == compose["services"]["redis"]["image"]
        assert spec["hostname"] == node, "the node announces the name the others resolve"
        for option in ("--cluster-enabled yes", "--appendonly yes", "--cluster-announce-hostname"):
            assert option in command, (node, option)
        # Clients and replicas (which authenticate to their master) use the one required password.
        assert '--requirepass "$$REDISCLI_AUTH"' in command and '--masterauth "$$REDISCLI_AUTH"' in command
        assert service_env(compose, node) == {"REDISCLI_AUTH": REQUIRED["REDIS_PASSWORD"]}
        assert "ports" not in spec and "redis-cli ping" in " ".join(spec["healthcheck"]["test"])
        [volume] = spec["volumes"]
        volumes.add(volume.split(":")[0])
        assert volume.endswith(":/data") and volume.split(":")[0] in compose["volumes"]
    assert len(volumes) == len(CLUSTER_NODES), "each node needs its own data volume"


def test_cluster_create_waits_for_every_node_and_makes_three_masters(compose: dict[str, Any]) -> None:
    spec = compose["services"]["redis_cluster_create"]
    assert spec["depends_on"] == {node: {"condition": "service_healthy"} for node in CLUSTER_NODES}
    assert spec["restart"] == "no", "a one-shot: the cells wait for it to complete"
    command = " ".join(spec["command"])
    assert "redis-cli --cluster create" in command and "--cluster-replicas 1" in command
    # Six nodes, one replica each: 3 masters. Every node is looked up and joined.
    assert "for n in 1 2 3 4 5 6" in command and "redis-node-$$n" in command
    assert service_env(compose, "redis_cluster_create") == {"REDISCLI_AUTH": REQUIRED["REDIS_PASSWORD"]}
    for app in CLUSTER_APPS:
        condition = compose["services"][app]["depends_on"]["redis_cluster_create"]["condition"]
        assert condition == "service_completed_successfully", app


@pytest.mark.parametrize("service", CLUSTER_APPS)
def test_cluster_service_runs_on_the_cluster_in_its_cell(
    compose: dict[str, Any], service: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = compose["services"][service]
    command = [interpolate(str(part)) for part in spec["command"]]
    module = command[2]
    importlib.import_module(f"{module}.__main__").parse_args(command[3:])
    assert spec["build"] == "." and spec["image"] == compose["services"]["gateway"]["image"]
    assert "redis" not in spec["depends_on"], "the cells do not need the plain Redis"
    env = service_env(compose, service)
    unknown = set(env) - env_names(SETTINGS[module])
    assert not unknown, f"{service} sets variables it never reads: {unknown}"
    assert env["REDIS_CLUSTER"] == "true"
    nodes, options = cluster_nodes(env["REDIS_URL"])
    assert {host for host, _ in nodes} <= set(CLUSTER_NODES) and all(port == 6379 for _, port in nodes)
    assert options["password"] == REQUIRED["REDIS_PASSWORD"]
    # The service's own settings accept the environment compose gives it.
    for name, value in env.items():
        # /models is ./models mounted (test_default_model_is_the_shipped_demo): the demo is there.
        monkeypatch.setenv(name, value.replace("/models/", f"{ROOT / 'models'}/", 1))
    settings: Any = SETTINGS[module]()
    assert settings.redis_cluster is True
    assert service.startswith(f"cell_{settings.cell}_") or service == "cluster_gateway"


def test_cluster_gateway_places_in_every_cell_that_has_a_batcher_and_a_worker(
    compose: dict[str, Any],
) -> None:
    cells = {service: service_env(compose, service)["CBSERVE_CELL"] for service in CELL_SERVICES}
    batchers = {cell for service, cell in cells.items() if service.endswith("_batcher")}
    workers = {cell for service, cell in cells.items() if service.endswith("_worker")}
    assert batchers == workers == {"a", "b"}
    gateway = service_env(compose, "cluster_gateway")
    assert set(gateway["GATEWAY_CELLS"].split(",")) == batchers
    assert gateway["CBSERVE_CELL"] in batchers
    plain = service_env(compose, "gateway")
    assert {k: v for k, v in gateway.items() if k in plain and k != "REDIS_URL"} == {
        k: v for k, v in plain.items() if k != "REDIS_URL"
    }, "the cluster gateway is configured like the plain one"


def test_celery_broker_stays_a_plain_redis_apart_from_the_cluster(compose: dict[str, Any]) -> None:
    celery = compose["services"]["celery_worker"]
    env = service_env(compose, "celery_worker")
    assert "cluster" not in celery["profiles"] and "REDIS_CLUSTER" not in env
    assert "@redis:6379" in env["REDIS_URL"] and "," not in env["REDIS_URL"]
    assert "--cluster-enabled" not in " ".join(compose["services"]["redis"]["command"])
    for app in CLUSTER_APPS:
        assert "@redis:" not in service_env(compose, app)["REDIS_URL"], app


def shell_script(compose: dict[str, Any], service: str) -> str:
    """The `sh -c` script of a service, as the container's shell gets it (compose turns `$$` to `$`)."""
    command = compose["services"][service]["command"]
    assert command[:2] == ["sh", "-c"]
    return str(command[2]).replace("$$", "$")


def test_cluster_scripts_are_valid_shell(compose: dict[str, Any]) -> None:
    for service in ("redis-node-1", "redis_cluster_create"):
        checked = subprocess.run(["sh", "-n", "-c", shell_script(compose, service)], capture_output=True)
        assert checked.returncode == 0, (service, checked.stderr)


# ----- profile `models`: two base models behind one gateway, a cell each ----------------------------------
MODEL_SERVICES = ["demo_batcher", "demo_worker", "second_batcher", "second_worker"]


def test_models_profile_serves_each_model_of_its_config_in_its_own_cells(
    compose: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    services = compose["services"]
    in_profile = {name for name, spec in services.items() if spec.get("profiles") == ["models"]}
    assert in_profile == {*MODEL_SERVICES, "models_gateway"}
    gateway = services["models_gateway"]
    assert set(gateway["depends_on"]) == {"redis", *MODEL_SERVICES}
    [config] = gateway["configs"]
    assert compose["configs"][config["source"]]["file"] == "./deploy/models.json"
    env = service_env(compose, "models_gateway")
    assert env["GATEWAY_MODELS_CONFIG"] == config["target"]
    models = load_models_config(ROOT / "deploy" / "models.json")
    assert len(models.models) == 2
    # Each model's cells have a batcher and a worker of that model, on the plain Redis.
    for m in models.models:
        for cell in m.placement_cells:
            batcher, worker = service_env(compose, f"{cell}_batcher"), service_env(compose, f"{cell}_worker")
            assert batcher["CBSERVE_CELL"] == worker["CBSERVE_CELL"] == cell
            assert worker["MODEL"] == str(m.model)
            assert set(worker) <= env_names(WorkerSettings) and set(batcher) <= env_names(BatcherSettings)
            assert "@redis:6379" in worker["REDIS_URL"]
    command = [interpolate(str(part)) for part in gateway["command"]]
    importlib.import_module("gateway.__main__").parse_args(command[3:])
    assert set(env) <= env_names(GatewaySettings)
    # The gateway takes the file with the models in place (the demo twice, as `/models/second` too).
    for name in ("demo", "second"):
        (tmp_path / name).symlink_to(ROOT / "models" / "demo")
    text = (ROOT / "deploy" / "models.json").read_text().replace('"/models/', f'"{tmp_path}/')
    (tmp_path / "models.json").write_text(text)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("GATEWAY_MODELS_CONFIG", str(tmp_path / "models.json"))
    monkeypatch.delenv("MODEL", raising=False)
    assert GatewaySettings().model_name == "demo"
