"""Regenerate constraints.txt: the locked, tested set of every package (transitive) that the README's
commands and .ci/run install, resolved by pip's own resolver (`pip install --dry-run --report`).

    .venv/bin/python scripts/refresh_constraints.py      # then run the tests, commit constraints.txt

pyproject.toml keeps open ranges for library users; the constraints file pins what the figures in
docs/ were measured with. torch is pinned to the CPU build this project installs first."""
import json
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXTRAS = "test,postgres,ray"
TORCH = "torch==2.13.0"


def resolve() -> dict[str, str]:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--dry-run", "--ignore-installed",
                        "--report", str(report), TORCH, f"{ROOT}[{EXTRAS}]"], check=True)
        installs = json.loads(report.read_text())["install"]
    return {i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"]
            for i in installs if i["metadata"]["name"] != "milegpo"}


def main() -> None:
    pins = resolve()
    lines = [f"# Locked set for milegpo[{EXTRAS}] with {TORCH} (Python {sys.version_info.major}."
             f"{sys.version_info.minor}), resolved {date.today()} by scripts/refresh_constraints.py.",
             "# Used as `pip install -c constraints.txt ...` by the README's commands and .ci/run."]
    lines += [f"{name}=={version.split('+')[0]}" for name, version in sorted(pins.items())]
    (ROOT / "constraints.txt").write_text("\n".join(lines) + "\n")
    print(f"constraints.txt: {len(pins)} packages")


if __name__ == "__main__":
    main()
