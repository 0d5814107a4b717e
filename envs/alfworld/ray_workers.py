"""ALFWorld engine workers as Ray actors (``env.alfworld.workers_backend = "ray"``).

Each actor holds the engines of a block of slots, as a worker process does, and answers the same
requests (engine.serve); the vector env talks to it through a pipe-like :class:`ActorConn`: Ray runs
one caller's calls to an actor in the order they were sent, so answers come back in order and the
pipelined rollout lanes work unchanged. An actor asks ``ray_cpus`` CPUs and 0.01 of the custom
resource ``ray_resource`` (when set), so actors go to the nodes started with it (``ray start
--resources '{"env_host": 1}'``) and up to 100 share one unit. The process joins the cluster at
``RAY_ADDRESS`` (set for members run by ``ablate --ray``), else the one found on this node (``auto``).
"""
from __future__ import annotations

import os
from collections import deque

from envs.alfworld.game_env import ENGINE_HASH_SEED, GameEnv, serve, transition_cache
from envs.base import EnvError

RESOURCE_SHARE = 0.01  # of ray_resource per actor
PLACE_TIMEOUT_S = 20.0  # room for a pool's actors must be found within this (an actor starts in about a second)


class EngineActor:
    """The engines of one worker's slots (a Ray actor class once wrapped by ``ray.remote``)."""

    def __init__(self, experts, max_steps: int, cache_size: int):
        self.experts, self.max_steps = experts, max_steps
        self.cache = transition_cache(cache_size) if cache_size else None
        self.envs: dict[int, GameEnv] = {}

    def handle(self, cmd: str, items) -> list:
        return serve(self.envs, self.cache, self.experts, self.max_steps, cmd, items)

    def close(self) -> None:
        for e in self.envs.values():
            e.close()
        self.envs.clear()

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()


class ActorConn:
    """The worker's end of a pipe, over an actor's method calls: ``send`` calls, ``poll`` waits for the
    oldest answer, ``recv`` takes it (a dead actor reads as a closed pipe: EOFError)."""

    def __init__(self, actor):
        self.actor, self.pending = actor, deque()

    def send(self, message) -> None:
        cmd, items = message
        self.pending.append(self.actor.close.remote() if cmd == "close" else self.actor.handle.remote(cmd, items))

    def poll(self, timeout: float | None = None) -> bool:
        import ray

        if not self.pending:
            return False
        ready, _ = ray.wait([self.pending[0]], timeout=timeout)
        return bool(ready)

    def recv(self):
        import ray

        try:
            return ray.get(self.pending.popleft())
        except ray.exceptions.RayActorError as err:
            raise EOFError(f"engine actor died: {err}") from None


class ActorHandle:
    """The worker's process handle: ``kill`` ends the actor (the vector env replaces a hung worker)."""

    def __init__(self, actor):
        self.actor, self.alive = actor, True

    def kill(self) -> None:
        import ray

        ray.kill(self.actor)
        self.alive = False

    def join(self, timeout: float | None = None) -> None:
        pass

    def is_alive(self) -> bool:
        return self.alive


def connect() -> None:
    """Join the cluster (``RAY_ADDRESS``, else the one on this node); EnvError when there is none."""
    try:
        import ray
    except ModuleNotFoundError:
        raise EnvError("env.alfworld.workers_backend = 'ray' needs Ray: pip install 'milegpo[ray]'") from None
    if ray.is_initialized():
        return
    address = os.environ.get("RAY_ADDRESS") or "auto"
    try:
        ray.init(address=address, log_to_driver=False)
    except (ConnectionError, RuntimeError) as err:
        raise EnvError(f"env.alfworld.workers_backend = 'ray': no Ray cluster at {address} ({err}); start one "
                       "(ray start --head) or set RAY_ADDRESS") from None


def check_room(actors: int, resource: str, cpus: float) -> None:
    """Refuse (EnvError, one line) ``actors`` engine actors of ``cpus`` CPUs (and a share of ``resource``)
    that the cluster cannot place now: a placement group of one bundle per actor must be ready within
    :data:`PLACE_TIMEOUT_S` (it is removed at once; the actors then take its room)."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    connect()
    bundle = {k: v for k, v in (("CPU", cpus), (resource, RESOURCE_SHARE)) if k and v > 0}
    if not bundle:
        return
    group = placement_group([bundle] * actors, strategy="SPREAD")
    try:
        placed = group.wait(timeout_seconds=PLACE_TIMEOUT_S)
    finally:
        remove_placement_group(group)
    if placed:
        return
    nodes = [n for n in ray.nodes() if n["Alive"] and (not resource or resource in n["Resources"])]
    where = f"the {len(nodes)} node(s) with {resource!r}" if resource else f"the {len(nodes)} node(s)"
    total = sum(n["Resources"].get("CPU", 0.0) for n in nodes)
    raise EnvError(f"env.alfworld.workers_backend = 'ray': {actors} engine actors of {cpus:g} CPUs "
                   f"(env.alfworld.ray_worker_cpus) do not fit on {where} ({total:g} CPUs in all, some held by "
                   f"other work) within {PLACE_TIMEOUT_S:g} s; lower env.alfworld.workers or ray_worker_cpus, or "
                   "add nodes")


def spawn(experts, max_steps: int, cache_size: int, resource: str, cpus: float) -> tuple[ActorHandle, ActorConn]:
    """A new engine actor, as (process handle, pipe end)."""
    import ray

    connect()
    actor = ray.remote(EngineActor).options(num_cpus=cpus, resources={resource: RESOURCE_SHARE} if resource else {},
                                            max_restarts=0,
                                            runtime_env={"env_vars": {"PYTHONHASHSEED": ENGINE_HASH_SEED}}
                                            ).remote(experts, max_steps, cache_size)
    return ActorHandle(actor), ActorConn(actor)
