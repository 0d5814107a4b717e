"""What a run is called and what it can be traced to: its name, the git commit and package versions."""
from __future__ import annotations

from pathlib import Path

from milegpo_cli.config import Config


def run_name(config: Config) -> str:
    drop = "-".join(sorted(config.credit.drop))
    base = config.run.name or f"{Path(config.recipe).stem or config.env.name}-{config.run.algo}"
    return f"{base}{'-drop-' + drop if drop and not config.run.name else ''}-s{config.run.seed}"


def package_versions() -> dict[str, str]:
    """The installed versions of the packages a figure depends on."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
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
