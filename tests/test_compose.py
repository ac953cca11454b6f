"""docker-compose.yml agrees with the real entry points (no Docker engine runs here to try it)."""

from __future__ import annotations

import importlib
import json
import re
import shlex
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from pydantic_settings import BaseSettings

from batcher.settings import BatcherSettings
from cbserve_celery.settings import CelerySettings
from gateway.settings import GatewaySettings
from gpu_worker.settings import WorkerSettings

ROOT = Path(__file__).resolve().parent.parent
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
    assert set(services) == {"redis", "gateway", "batcher", "gpu_worker", "celery_worker"}
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
    assert published == ["gateway"]
    [mapping] = compose["services"]["gateway"]["ports"]
    assert interpolate(mapping).endswith(":8000")
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
    assert settings.visibility_timeout_s > settings.request_timeout_s
    assert spec["depends_on"]["redis"]["condition"] == "service_healthy"
    assert "cbserve_celery.worker" in " ".join(spec["healthcheck"]["test"])
    assert spec["build"] == "." and spec["image"] == compose["services"]["gateway"]["image"]


def test_dockerfile_installs_every_service() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    for package in ("common", "openai_frontend", "gateway", "batcher", "gpu_worker", "cbserve_celery"):
        assert f"COPY {package} ./{package}" in dockerfile
    assert 'pip install ".[worker,gateway,celery]"' in dockerfile
    assert "pip install torch==" in dockerfile


def test_no_default_redis_password() -> None:
    """An unset REDIS_PASSWORD stops `docker compose up` with a message, never a known password."""
    text = (ROOT / "docker-compose.yml").read_text()
    uses = re.findall(r"\$\{REDIS_PASSWORD[^}]*\}", text)
    assert uses, "the services get the Redis password from REDIS_PASSWORD"
    assert all(use.startswith("${REDIS_PASSWORD:?") and len(use) > len("${REDIS_PASSWORD:?}") for use in uses)
    assert "change-me" not in text
