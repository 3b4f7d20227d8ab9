"""Fixtures for tests against real components: a redis-server and a Postgres on free ports in temp folders."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from examlops.core.settings import Settings
from examlops.platform.process import pid_alive
from examlops.platform.redis_server import EmbeddedRedis
from tests.ports import free_port


@pytest.fixture(scope="session")
def embedded_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    """One real redis-server for the session (it starts in ~0.1 s, but every test would pay the fixture churn).

    Tests share it: use keys or streams of your own, or FLUSHDB at the start.
    Teardown asserts the server process is gone.
    """
    server = EmbeddedRedis(tmp_path_factory.mktemp("redis"), free_port())
    server.start()
    pid = server.process.pid
    assert pid is not None
    yield server
    server.stop()
    assert not pid_alive(pid), f"redis-server {pid} outlived its fixture"


@pytest.fixture(scope="session")
def redis_server(embedded_redis: EmbeddedRedis) -> str:
    """The URL (``redis://127.0.0.1:<port>/0``) of the session's real redis-server."""
    return embedded_redis.url


@pytest.fixture
def client(redis_server: str) -> Iterator[redis.Redis]:
    """A client (decoded strings) of the session's Redis, whose database starts empty for each test."""
    from examlops.adapters.redis import connect

    client = connect(redis_server)
    client.flushdb()
    yield client
    client.close()


@pytest.fixture
def redis_dir(tmp_path: Path) -> Path:
    return tmp_path / "redis"


PG_PROGRAMS = ("initdb", "pg_ctl", "postgres")


def _postgres_bin() -> Path | None:
    """The folder holding initdb, pg_ctl and postgres: on PATH, then ``pg_config --bindir``, then Debian's
    versioned ``/usr/lib/postgresql/<N>/bin`` (newest first), where its package puts them off PATH."""
    candidates: list[Path] = []
    if found := shutil.which("pg_ctl"):
        candidates.append(Path(found).resolve().parent)
    if pg_config := shutil.which("pg_config"):
        bindir = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True).stdout.strip()
        if bindir:
            candidates.append(Path(bindir))
    debian = Path("/usr/lib/postgresql").glob("*/bin")
    candidates += sorted(debian, key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0, reverse=True)
    return next((c for c in candidates if all((c / name).exists() for name in PG_PROGRAMS)), None)


def _as_postgres(argv: list[str]) -> list[str]:
    """initdb refuses to run as root: run the Postgres binaries as the ``postgres`` user when we are root."""
    if os.geteuid() != 0:
        return argv
    return ["runuser", "-u", "postgres", "--", *argv]


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """One real Postgres 15 for the session, on a free port of 127.0.0.1, in a temp folder; its admin URL.

    Skips when the binaries are missing (``scripts/setup.sh`` installs Debian's package where it can), unless
    ``EXAMLOPS_REQUIRE_POSTGRES=1`` (set by CI), where a missing server fails. Teardown stops it.
    """
    bin_dir = _postgres_bin()
    if bin_dir is None:
        reason = "Postgres binaries (initdb, pg_ctl, postgres) are not on PATH, pg_config's or /usr/lib/postgresql"
        if os.environ.get("EXAMLOPS_REQUIRE_POSTGRES") == "1":
            pytest.fail(reason + " and EXAMLOPS_REQUIRE_POSTGRES=1")
        pytest.skip(reason)
    if os.geteuid() == 0 and subprocess.run(["id", "postgres"], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "--system", "--no-create-home", "postgres"], check=True)
    # /tmp, not pytest's tmp_path: the postgres user must be able to reach the folder.
    root = Path(tempfile.mkdtemp(prefix="examlops-pg-"))
    if os.geteuid() == 0:
        owner = pwd.getpwnam("postgres")
        os.chown(root, owner.pw_uid, owner.pw_gid)
    data, port = root / "data", free_port()
    pg_ctl = [str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(root / "postgres.log")]
    initdb = [str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"]
    subprocess.run(_as_postgres(initdb), check=True, capture_output=True)
    options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=50"
    started = subprocess.run(_as_postgres([*pg_ctl, "-o", options, "-w", "-t", "60", "start"]), capture_output=True)
    if started.returncode != 0:
        log = (root / "postgres.log").read_text(errors="replace")
        shutil.rmtree(root, ignore_errors=True)
        raise RuntimeError(f"postgres did not start: {started.stderr!r}\n{log}")
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(_as_postgres([*pg_ctl, "-m", "fast", "-w", "stop"]), capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def postgres_url(postgres_server: str) -> Iterator[str]:
    """The URL of a database of its own on the session's Postgres, dropped after the test."""
    import sqlalchemy

    name = f"t_{uuid.uuid4().hex[:12]}"
    admin = sqlalchemy.create_engine(postgres_server, isolation_level="AUTOCOMMIT", poolclass=sqlalchemy.NullPool)
    with admin.connect() as connection:
        connection.exec_driver_sql(f"CREATE DATABASE {name}")
    yield postgres_server.rsplit("/", 1)[0] + f"/{name}"
    with admin.connect() as connection:
        connection.exec_driver_sql(f"DROP DATABASE {name} WITH (FORCE)")
    admin.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty database: SQLite in the test's folder, then a database on the session's Postgres."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'examlops.db'}"
    url: str = request.getfixturevalue("postgres_url")
    return url


@pytest.fixture
def settings(state_dir: Path) -> Settings:
    """Settings with a private state folder whose SQL schema is upgraded, as `exa up` leaves it."""
    from examlops.bootstrap import upgrade_database

    settings = Settings(home=state_dir)
    upgrade_database(settings)
    return settings
