"""tests/verl_plugin run in the verl venv (.ci/verl, constraints-verl.txt); where verl is not installed
(the main suite's venv) they are not collected."""
import importlib.util

collect_ignore_glob = [] if importlib.util.find_spec("verl") else ["test_*.py"]
