"""What a run starts from: ``milegpo envs generate`` (ALFWorld games) and ``milegpo policy build-base``
(the cached base policy)."""
from __future__ import annotations

from typing import Annotated, Optional

import typer

from milegpo_cli.commands.common import (RecipeOpt, RunsDirOpt, SetOpt, build_config, check_runs_folder, command,
                                         console, engine_data, fail)

envs_app = typer.Typer(help="Environment data: generate ALFWorld games.", no_args_is_help=True, rich_markup_mode=None)
policy_app = typer.Typer(help="Starting policies: build the cached base policy.", no_args_is_help=True,
                         rich_markup_mode=None)


@envs_app.command("generate")
@command
def envs_generate(env: Annotated[str, typer.Option("--env", metavar="ENV", help="Environment (alfworld).")] = "alfworld",
                  split: Annotated[str, typer.Option("--split", metavar="SPLIT", help="train, id or ood.")] = "train",
                  n: Annotated[int, typer.Option("-n", min=1, metavar="N", help="Number of games.")] = 100,
                  recipe: Annotated[Optional[str], typer.Option(
                      "--recipe", "-r", metavar="NAME|PATH", help="Recipe [default: the --env name].")] = None,
                  sets: SetOpt = None, runs_dir: RunsDirOpt = None) -> None:
    """Generate ALFWorld games (PDDL + traj_data) of a split with the real engine's assets.

    The games go to env.alfworld.data_dir (default <runs-dir>/alfworld), as `train` reads them.
    """
    if env != "alfworld":
        raise fail(f"--env: only 'alfworld' has games to generate, got {env!r}", 2)
    config = build_config(recipe or env, sets, runs_dir=runs_dir)
    check_runs_folder(config)
    engine_data(config.store.root)  # before the engine's import, which creates ALFWORLD_DATA
    from rich.progress import Progress

    from envs.alfworld import generate_games

    with Progress(console=console) as bar:
        task = bar.add_task(f"alfworld {split}", total=n)
        result = generate_games(config.env.alfworld, split, n, lambda done, total: bar.update(task, completed=done))
    console.print(f"generated {len(result) if hasattr(result, '__len__') else n} games ({split})")


@policy_app.command("build-base")
@command
def policy_build_base(recipe: RecipeOpt = "alfworld", sets: SetOpt = None, runs_dir: RunsDirOpt = None) -> None:
    """Build (once) the recipe's cached base policy.

    The base policy is the supervised starting point of PPO (recipe section [base]).
    """
    config = build_config(recipe, sets, runs_dir=runs_dir)
    check_runs_folder(config)
    engine_data(config.store.root)
    from milegpo_cli.trainer.base_policy import build_for_recipe

    folder, metrics = build_for_recipe(config, console.print)
    console.print(f"base policy {folder}: " + "  ".join(f"{k} {v:.4g}" for k, v in metrics.items()))
