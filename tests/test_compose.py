"""docker-compose.yml agrees with itself, the Dockerfile and the settings: every service restarts and has a health
check, ports and host names line up, volumes exist, only the `gpu` profile asks for a GPU.

`docker compose config` validates the file against Compose's schema where Docker is installed (the last test);
everything else here needs only PyYAML, so it runs on machines without Docker too."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parent.parent
COMPOSE_FILE = ROOT / "docker-compose.yml"
RESTART_POLICIES = {"always", "unless-stopped", "on-failure"}
CONTROL_PLANE = ["web", "worker", "beat"]
# What `docker compose up` needs from .env; anything else has a default.
REQUIRED_ENV = {"DJANGO_SECRET_KEY": "x" * 50, "RAY_AUTH_TOKEN": "t" * 32}
VARIABLE = re.compile(r"\$\$|\$\{(\w+)(?:(:?[-?])([^}]*))?\}|\$(\w+)")


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose's ${VAR}, ${VAR:-default}, ${VAR:?error} and $$, as `docker compose` expands them."""
    if isinstance(value, dict):
        return {key: interpolate(item, env) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolate(item, env) for item in value]
    if not isinstance(value, str):
        return value

    def expand(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1) or match.group(4)
        operator, argument = match.group(2), match.group(3)
        present = env.get(name)
        if operator in (":-", "-"):
            return present if present or (operator == "-" and present is not None) else argument
        if operator in (":?", "?") and not present:
            raise AssertionError(f"docker compose refuses to start without {name}: {argument}")
        return present or ""

    return VARIABLE.sub(expand, value)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    document = yaml.safe_load(COMPOSE_FILE.read_text())  # safe_load applies the `<<:` merge keys
    return {key: value for key, value in interpolate(document, REQUIRED_ENV).items() if not key.startswith("x-")}


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = compose["services"]
    return found


def command_of(service: dict[str, Any]) -> list[str]:
    command = service["command"]
    return command if isinstance(command, list) else command.split()


def flag(command: list[str], name: str) -> str:
    """The value of --name=value or --name value (or -n value) in a command line."""
    for index, part in enumerate(command):
        if part.startswith(f"{name}="):
            return part.split("=", 1)[1]
        if part == name:
            return command[index + 1]
    raise AssertionError(f"{name} not in {command}")


def healthcheck_text(service: dict[str, Any]) -> str:
    return " ".join(service["healthcheck"]["test"])


def published(service: dict[str, Any]) -> dict[int, str]:
    """container port -> the host side ("8000", "127.0.0.1:8265")."""
    ports = {}
    for entry in service.get("ports", []):
        host, _, container = str(entry).rpartition(":")
        ports[int(container)] = host
    return ports


# --- every service -----------------------------------------------------------------------------------------------
def test_the_expected_services_are_there(services):
    assert set(services) == {"db", "redis", "web", "worker", "beat", "ray-head", "ray-gpu-worker"}


def test_every_service_restarts_and_has_a_health_check(services):
    for name, service in services.items():
        assert service.get("restart") in RESTART_POLICIES, f"{name}: restart policy {service.get('restart')!r}"
        check = service.get("healthcheck")
        assert check, f"{name} has no healthcheck"
        assert not check.get("disable") and check["test"][0] in {"CMD", "CMD-SHELL"}, name
        for key in ("interval", "timeout", "retries"):
            assert key in check, f"{name}: healthcheck without {key}"


def test_services_wait_only_for_healthy_services_that_exist(services):
    for name, service in services.items():
        for dependency, condition in (service.get("depends_on") or {}).items():
            assert dependency in services, f"{name} depends on unknown {dependency}"
            assert condition["condition"] == "service_healthy", (name, dependency)
            assert "healthcheck" in services[dependency]
            assert "profiles" not in services[dependency], f"{name} depends on a service of an optional profile"


def test_every_named_volume_is_declared_and_every_declared_volume_is_used(compose, services):
    used = set()
    for name, service in services.items():
        for entry in service.get("volumes", []):
            source = entry.split(":", 1)[0] if isinstance(entry, str) else entry["source"]
            if not source.startswith(("/", ".")):
                assert source in compose["volumes"], f"{name} mounts undeclared volume {source!r}"
                used.add(source)
    assert used == set(compose["volumes"])


def test_the_images_are_built_from_stages_the_dockerfile_has(services):
    stages = set(re.findall(r"^FROM \S+ AS (\S+)$", (ROOT / "Dockerfile").read_text(), re.MULTILINE))
    for name, service in services.items():
        if "build" in service:
            assert service["build"]["target"] in stages, name


# --- ports and host names ------------------------------------------------------------------------------------------
def test_the_web_port_is_the_same_in_the_command_the_mapping_the_health_check_and_the_public_url(services):
    web = services["web"]
    line = command_of(web)[-1].split()  # sh -c "... && exec uvicorn ... --port 8000 ..."
    port = int(flag(line, "--port"))
    assert "migrate --noinput && exec uvicorn controlplane.asgi:application" in command_of(web)[-1]
    assert flag(line, "--host") == "0.0.0.0" and int(flag(line, "--workers")) >= 1  # CRUCIBLE_WEB_WORKERS, default 2
    assert port in published(web)
    assert f"http://localhost:{port}/healthz" in healthcheck_text(web)
    public = urlsplit(web["environment"]["CRUCIBLE_PUBLIC_URL"])
    assert (public.hostname, public.port) == ("web", port)


def test_the_health_checked_and_reporting_hosts_are_allowed_hosts(services):
    for name in CONTROL_PLANE:
        allowed = services[name]["environment"]["DJANGO_ALLOWED_HOSTS"].split(",")
        assert "localhost" in allowed and "web" in allowed, (name, allowed)


def test_database_and_redis_urls_name_the_db_and_redis_services(services):
    db = services["db"]["environment"]
    for name in CONTROL_PLANE:
        env = services[name]["environment"]
        database = urlsplit(env["DATABASE_URL"])
        assert (database.scheme, database.hostname, database.port or 5432) == ("postgresql", "db", 5432)
        assert (database.username, database.password) == (db["POSTGRES_USER"], db["POSTGRES_PASSWORD"])
        assert database.path.lstrip("/") == db["POSTGRES_DB"]
        redis = urlsplit(env["REDIS_URL"])
        assert (redis.scheme, redis.hostname, redis.port) == ("redis", "redis", 6379)
    assert f"-U {db['POSTGRES_USER']} -d {db['POSTGRES_DB']}" in healthcheck_text(services["db"])


def test_the_ray_addresses_name_the_head_and_its_ports(services):
    head = services["ray-head"]
    command = command_of(head)
    dashboard, gcs = int(flag(command, "--dashboard-port")), int(flag(command, "--port"))
    for name in CONTROL_PLANE:
        address = urlsplit(services[name]["environment"]["RAY_ADDRESS"])
        assert (address.hostname, address.port) == ("ray-head", dashboard)
    assert f"http://localhost:{dashboard}/" in healthcheck_text(head)
    assert published(head) == {dashboard: "127.0.0.1:8265"}  # the dashboard stays on the host's loopback
    worker = services["ray-gpu-worker"]
    assert flag(command_of(worker), "--address") == f"ray-head:{gcs}"
    agent = int(flag(command_of(worker), "--dashboard-agent-listen-port"))
    assert f"http://localhost:{agent}/api/local_raylet_healthz" in healthcheck_text(worker)


def test_the_worker_and_beat_run_the_projects_celery_app_and_their_checks_match(services):
    assert (ROOT / "controlplane" / "celery.py").exists()
    worker, beat = services["worker"], services["beat"]
    assert command_of(worker)[:4] == ["celery", "-A", "controlplane", "worker"]
    assert "celery -A controlplane inspect ping --destination celery@$HOSTNAME" in healthcheck_text(worker)
    assert command_of(beat)[:4] == ["celery", "-A", "controlplane", "beat"]
    schedule = flag(command_of(beat), "--schedule")
    assert f"glob.glob('{schedule}*')" in healthcheck_text(beat)


# --- settings ------------------------------------------------------------------------------------------------------
def test_the_control_plane_runs_with_debug_off_a_secret_from_env_and_settings_that_exist(services):
    settings_source = (ROOT / "controlplane" / "settings.py").read_text()
    raw = yaml.safe_load(COMPOSE_FILE.read_text())
    assert raw["x-control-plane-env"]["DJANGO_SECRET_KEY"].startswith("${DJANGO_SECRET_KEY:?")
    for name in CONTROL_PLANE:
        env = services[name]["environment"]
        assert env["DJANGO_DEBUG"] == "0"
        for variable in env:
            if not variable.startswith("RAY_AUTH_"):  # those are Ray's own
                assert f'"{variable}"' in settings_source, f"{variable} is set for {name} but no setting reads it"
        assert env["CRUCIBLE_MEDIA_ROOT"] == "/data/media"
        if name != "beat":
            assert "media:/data/media" in services[name]["volumes"]


def test_only_the_gpu_profile_asks_for_a_gpu(services):
    for name, service in services.items():
        devices = (service.get("deploy") or {}).get("resources", {}).get("reservations", {}).get("devices", [])
        wants_gpu = any("gpu" in device.get("capabilities", []) for device in devices)
        assert wants_gpu == (service.get("profiles") == ["gpu"]), name
    assert services["ray-gpu-worker"]["build"]["target"] == "gpu"
    assert "--num-gpus=0" in command_of(services["ray-head"])  # GPU work goes to the GPU workers


def test_the_interpolation_used_here_behaves_like_compose():
    env = {"SET": "v", "EMPTY": ""}
    assert interpolate("${SET:-d} ${EMPTY:-d} ${UNSET:-d} ${EMPTY-d} $$HOME ${SET}", env) == "v d d  $HOME v"
    with pytest.raises(AssertionError, match="UNSET"):
        interpolate("${UNSET:?set it}", env)


# --- Docker's own validation, where Docker is installed -------------------------------------------------------------
def test_docker_compose_config_accepts_the_file_with_and_without_the_gpu_profile():
    docker = shutil.which("docker")
    if docker is None or subprocess.run([docker, "compose", "version"], capture_output=True).returncode != 0:
        pytest.skip("docker compose is not installed here; CI runs this where it is")
    env = {"PATH": str(Path(docker).parent), **REQUIRED_ENV}
    for profile in ([], ["--profile", "gpu"]):
        done = subprocess.run(
            [docker, "compose", "-f", str(COMPOSE_FILE), *profile, "config", "--quiet"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr
