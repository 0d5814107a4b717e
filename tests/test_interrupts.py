"""A Ctrl-C or SIGTERM that arrives inside a database write waits for the write's end (interrupts.py):
the run can then still be marked killed in the store and in MLflow (a CI failure of
test_sigterm_stops_ablate_members_and_marks_them_killed: "database is locked", run marked failed)."""
from __future__ import annotations

import os
import signal
import threading

import pytest
from sqlalchemy import Engine, event

from milegpo_cli.interrupts import deferred_interrupts
from milegpo_cli.store import RunStore


@pytest.fixture
def sigterm_raises_keyboard_interrupt():
    """cli.main's own handler: SIGTERM ends a command as Ctrl-C does."""
    from milegpo_cli.interrupts import stop_as_interrupt

    previous = signal.signal(signal.SIGTERM, stop_as_interrupt)
    yield
    signal.signal(signal.SIGTERM, previous)


@pytest.fixture
def sigterm_at_first_sql():
    """SIGTERM this process when the next SQL statement of any engine is sent: the signal arrives
    inside a transaction of the real store (ours or MLflow's)."""
    sent = []

    def send(*_args):
        if not sent:
            sent.append(True)
            os.kill(os.getpid(), signal.SIGTERM)

    def arm():
        event.listen(Engine, "before_cursor_execute", send)
    yield arm
    if event.contains(Engine, "before_cursor_execute", send):
        event.remove(Engine, "before_cursor_execute", send)


def test_a_signal_in_the_block_is_delivered_at_its_end(sigterm_raises_keyboard_interrupt):
    done, before = [], signal.getsignal(signal.SIGINT)  # SIG_IGN when pytest runs as a background job (`cmd &`)
    with pytest.raises(KeyboardInterrupt):
        with deferred_interrupts():
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGINT)
            done.append("the rest of the block")
    assert done == ["the rest of the block"]
    assert signal.getsignal(signal.SIGINT) is before  # handlers restored


def test_nested_blocks_deliver_at_the_outermost_end(sigterm_raises_keyboard_interrupt):
    done = []
    with pytest.raises(KeyboardInterrupt):
        with deferred_interrupts():
            with deferred_interrupts():
                os.kill(os.getpid(), signal.SIGTERM)
            done.append("after the inner block")
    assert done == ["after the inner block"]


def test_no_signal_no_interrupt_and_other_threads_run_unchanged():
    with deferred_interrupts():
        pass
    errors = []

    def worker():
        try:
            with deferred_interrupts():  # signal.signal would raise ValueError outside the main thread
                pass
        except Exception as err:  # noqa: BLE001
            errors.append(err)
    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert errors == []


def test_sigterm_inside_an_mlflow_write_still_ends_the_run_killed(tmp_path, sigterm_raises_keyboard_interrupt,
                                                                   sigterm_at_first_sql):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from milegpo_cli.store.tracking import Tracker

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(uri)
    run_id = tracker.start_run("r")
    sigterm_at_first_sql()
    with pytest.raises(KeyboardInterrupt):
        tracker.log_metrics({"success_rate": 0.5}, step=1)
    tracker.end("KILLED")  # an interrupted transaction can hold the lock: "database is locked" here
    run = MlflowClient(uri).get_run(run_id)
    assert run.info.status == "KILLED"
    assert run.data.metrics == {"success_rate": 0.5}  # the interrupted write completed (lost without the fix)


def test_sigterm_inside_a_store_write_still_ends_the_run_killed(tmp_path, sigterm_raises_keyboard_interrupt,
                                                                sigterm_at_first_sql):
    with RunStore(tmp_path / "runs.db") as store:
        run_id = store.create_run("r", "milegpo")
        sigterm_at_first_sql()
        with pytest.raises(KeyboardInterrupt):
            store.record_iteration(run_id, 1, {"success_rate": 0.5})
        store.set_status(run_id, "killed")
        assert store.get_run(run_id)["status"] == "killed"
        assert [it["iteration"] for it in store.iterations(run_id)] == [1]


def test_the_stop_grace_is_seconds_from_the_environment(monkeypatch):
    """MILEGPO_STOP_GRACE: the seconds a stopped member's train gets before SIGKILL (0: at once); else one line."""
    from milegpo_cli.errors import MilegpoError
    from milegpo_cli.interrupts import STOP_GRACE_ENV, stop_grace

    monkeypatch.delenv(STOP_GRACE_ENV, raising=False)
    assert stop_grace() == 60.0
    monkeypatch.setenv(STOP_GRACE_ENV, "0")
    assert stop_grace() == 0.0
    for bad in ("soon", "-1", "inf", "nan"):
        monkeypatch.setenv(STOP_GRACE_ENV, bad)
        with pytest.raises(MilegpoError, match=f"{STOP_GRACE_ENV}='{bad}': must be a number of seconds >= 0"):
            stop_grace()
