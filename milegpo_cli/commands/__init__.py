"""The ``milegpo`` commands, one module per group (``cli.py`` assembles them into the Typer app):
``common`` the error handling, shared options and helpers of every command, ``training`` train /
rollout / credit, ``experiments`` ablate / sweep / diagnose / compare / report, ``runs`` the
``runs`` group and ``ui``, ``prepare`` the ``envs`` and ``policy`` groups."""
