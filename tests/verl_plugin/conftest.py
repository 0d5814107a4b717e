"""tests/verl run in the verl venv (scripts/ci_verl.sh, constraints-verl.txt); without verl the main
suite does not collect them."""
import importlib.util

collect_ignore_glob = [] if importlib.util.find_spec("verl") else ["test_*.py"]
