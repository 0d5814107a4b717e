"""The locked install set (constraints.txt) and the library versions every run records."""
from __future__ import annotations

import os
import re
import shutil
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
from conftest import TINY_MODEL

from milegpo_cli.trainer.provenance import SOURCE_PACKAGES, source_digest

ROOT = Path(__file__).resolve().parents[1]
TINY = [*TINY_MODEL,
        "rollout.groups=2", "rollout.group_size=2", "ppo.epochs=1",
        "eval.episodes=2", "eval.splits=['id']", "eval.probe_states=4", "run.threads=1", "warmstart.enabled=false",
        "base.enabled=false", "rollout.train_tasks=8", "env.max_steps=3", "env.webshop.num_products=300",
        "env.webshop.train_instructions=40", "env.webshop.eval_instructions=4", "run.iterations=1", "eval.every=1"]


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~\[;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


OWN_LOCK = {"verl": "constraints-verl.txt"}  # extras locked apart (verl 0.9.1 pins transformers<5.11)


def _pins(name: str = "constraints.txt") -> dict[str, str]:
    lines = (ROOT / name).read_text().splitlines()
    return dict(line.split("==") for line in lines if line and not line.startswith("#"))


def test_constraints_pin_every_dependency_and_the_extras():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    wanted = project["dependencies"] + [r for name, extra in extras.items() if name not in OWN_LOCK for r in extra]
    missing = sorted({_name(r) for r in wanted} - set(_pins()))
    assert not missing, f"constraints.txt lacks {missing}: run scripts/refresh_constraints.py"
    for extra, lock in OWN_LOCK.items():
        missing = sorted({_name(r) for r in project["dependencies"] + extras[extra]} - set(_pins(lock)))
        assert not missing, f"{lock} lacks {missing}"


def test_installed_stack_is_the_locked_one():
    """CI installs with -c constraints.txt: what runs is what the lock says (local labels such as +cpu aside)."""
    pins = _pins()
    for pkg in ("torch", "transformers", "peft", "accelerate", "mlflow", "sqlalchemy", "numpy", "textworld"):
        assert version(pkg).split("+")[0] == pins[pkg], pkg


def test_source_digest_follows_the_code_not_the_docs(tmp_path):
    """Shared start evaluations (trainer/shared_start.py) compare this digest: an edit to a module changes it,
    a file that is not Python source (docs, a README beside the code) does not."""
    for package in SOURCE_PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    first = source_digest(tmp_path)
    assert first == source_digest(ROOT)  # where the folder lies plays no part
    (tmp_path / "milegpo_cli" / "NOTES.md").write_text("docs only")
    assert source_digest(tmp_path) == first
    module = tmp_path / "milegpo_cli" / "trainer" / "provenance.py"
    text = module.read_text()
    module.write_text(text + "\n# an uncommitted edit\n")
    assert source_digest(tmp_path) != first
    module.write_text(text)
    assert source_digest(tmp_path) == first
    module.rename(module.with_name("lineage.py"))  # the same bytes under another name
    assert source_digest(tmp_path) != first


@pytest.mark.slow
def test_run_records_library_versions_in_store_and_mlflow(tmp_path):
    from mlflow.tracking import MlflowClient
    from typer.testing import CliRunner

    from milegpo_cli.cli import app
    from milegpo_cli.store import RunStore

    os.environ.setdefault("ALFWORLD_DATA", str(ROOT / "runs" / "alfworld_data"))
    args = ["train", "--recipe", "webshop", "--runs-dir", str(tmp_path)]
    result = CliRunner().invoke(app, [*args, *[x for s in TINY for x in ("--set", s)]])
    assert result.exit_code == 0, result.output
    store = RunStore(tmp_path / "milegpo.db")
    run = store.get_run(1)
    store.close()
    assert run["versions"]["transformers"] == version("transformers")
    assert run["versions"]["mlflow"] == version("mlflow")
    assert run["versions"]["milegpo_source"] == source_digest()
    tags = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(run["mlflow_run_id"]).data.tags
    assert tags["version.torch"] == version("torch")
    assert tags["version.sqlalchemy"] == version("sqlalchemy")
