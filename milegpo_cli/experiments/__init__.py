"""Experiment management over the run store: ablate, sweep, compare, report (seed statistics), diagnose.

Every command reads only from the store (SQLite / any SQLAlchemy URL) and MLflow; see
docs/experiments.md. Entry points used by the CLI: ``ablate.run_ablate``, ``sweep.run_sweep``, ``compare.run_compare``,
``report.run_report``, ``diagnose.run_diagnose``.
"""
