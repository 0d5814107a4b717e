"""What a run is called and what it can be traced to: its name, the git commit, a digest of its source and
package versions."""
from __future__ import annotations

import hashlib
from pathlib import Path

from milegpo_cli.config import Config


def run_name(config: Config) -> str:
    drop = "-".join(sorted(config.credit.drop))
    base = config.run.name or f"{Path(config.recipe).stem or config.env.name}-{config.run.algo}"
    return f"{base}{'-drop-' + drop if drop and not config.run.name else ''}-s{config.run.seed}"


# the folder holding this project's packages: the checkout, or site-packages once installed
SOURCE_ROOT = Path(__file__).resolve().parents[2]
SOURCE_PACKAGES = ("milegpo_cli", "envs")


def source_digest(root: Path = SOURCE_ROOT) -> str:
    """A digest of the Python source of this project's packages under ``root``: equal for equal code whatever
    the git commit (a docs-only commit keeps it), different for an uncommitted edit."""
    digest = hashlib.sha256()
    for package in SOURCE_PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            name, text = path.relative_to(root).as_posix().encode(), path.read_bytes()
            digest.update(b"%d:%s%d:%s" % (len(name), name, len(text), text))
    return digest.hexdigest()[:16]


def package_versions() -> dict[str, str]:
    """The installed versions of the packages a figure depends on, and the digest of this project's source
    (``milegpo_source``)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {"milegpo_source": source_digest()}
    for pkg in ("milegpo", "torch", "transformers", "peft", "accelerate", "tokenizers", "numpy", "mlflow",
                "sqlalchemy", "alfworld", "textworld", "kernels"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


def git_commit() -> str | None:
    """The commit of the code being run, None outside a git checkout."""
    import subprocess

    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                              cwd=Path(__file__).resolve().parent).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None
