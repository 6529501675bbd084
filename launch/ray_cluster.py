"""The Ray side of a `--backend ray` job: connect (start a Ray instance, or attach), reserve one placement-group
bundle per rank, make the rank actors, and leave the cluster as found.

Ownership: without `--address` the job starts its own Ray instance and shuts it down; attached (`--address`, or a
Ray session this process already holds), it removes only its placement group and kills only its actors. Every
wait has a deadline (Ray's own connect timeout; PLACE_S for the bundles; CALL_S for an actor's answer).
"""
from __future__ import annotations

import logging
import os

from pypto_rt.launch import contract
from pypto_rt.launch.config import RAY_INSTALL, LaunchConfig

PLACE_S = 60.0   # longest wait for the placement group's bundles
CALL_S = 60.0    # longest wait for an actor's start-up or one answer (importing pypto_rt on a loaded node is slow)


class ClusterError(Exception):
    """Ray could not be reached or could not place the job; the message says what to do."""


def import_ray():
    """The ray module, or ClusterError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise ClusterError(f"--backend ray needs Ray, which is not installed: {RAY_INSTALL}") from None
    return ray


class Cluster:
    """This job's hold on Ray: its placement group and actors, and whether it started Ray itself."""

    def __init__(self, cfg: LaunchConfig):
        self.ray = import_ray()
        self.cfg = cfg
        self.started = False     # this job started a Ray instance: shut it down at the end
        self.connected = False   # this job connected the driver: disconnect it at the end
        self.pg = None
        self.actors: list = []
        if self.ray.is_initialized():   # a notebook's or test harness's session: use it, leave it
            return
        quiet = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.ERROR}
        try:
            if cfg.address:
                self.ray.init(address=cfg.address, **quiet)
            else:
                self.ray.init(address="local", **_local_resources(cfg), **quiet)
                self.started = True
            self.connected = True
        except (ConnectionError, RuntimeError, ValueError) as e:
            where = f"the Ray cluster at {cfg.address}" if cfg.address else "a local Ray instance"
            raise ClusterError(f"cannot connect to {where}: {_first_line(e)}; check --address (and, with Ray's "
                               "token auth, RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH as the cluster's, or "
                               "RAY_AUTH_MODE=disabled for a cluster started with it)") from None

    def node_id(self) -> str:
        return self.ray.get_runtime_context().get_node_id()

    def place(self) -> None:
        """Reserve one bundle per rank (PACK or SPREAD); ClusterError when Ray cannot within PLACE_S."""
        from ray.util.placement_group import placement_group
        bundle = dict(self.cfg.rank_resources)
        self.pg = placement_group([dict(bundle) for _ in range(self.cfg.nproc)], strategy=self.cfg.placement.upper(),
                                  name=f"pypto-{self.cfg.job_id}")
        ready, _ = self.ray.wait([self.pg.ready()], timeout=PLACE_S)
        if not ready:
            raise ClusterError(f"Ray could not place {self.cfg.nproc} bundles of {_bundle_text(bundle)} "
                               f"({self.cfg.placement}) within {PLACE_S:g} s; the cluster has "
                               f"{_bundle_text(self.ray.cluster_resources())} in all: lower --nproc or "
                               "--rank-resources, add nodes, or use --placement pack")

    def make_actors(self) -> list:
        """One RankHost actor per rank, rank i in bundle i; holds the bundle's resources (so a GPU/NPU bundle's
        devices are the rank's visible ones)."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from pypto_rt.launch.ray_rank import RankHost
        bundle = dict(self.cfg.rank_resources)
        actor_class = self.ray.remote(RankHost)
        custom = {k: v for k, v in bundle.items() if k not in ("CPU", "GPU")}
        for rank in range(self.cfg.nproc):
            strategy = PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=rank)
            self.actors.append(actor_class.options(
                num_cpus=bundle.get("CPU", 0), num_gpus=bundle.get("GPU", 0), resources=custom or None,
                scheduling_strategy=strategy, name=f"pypto-{self.cfg.job_id}-rank{rank}", max_restarts=0,
            ).remote(rank))
        return self.actors

    def get(self, refs: list, what: str):
        """ray.get within CALL_S; ClusterError naming `what` when the actors do not answer in time."""
        try:
            return self.ray.get(refs, timeout=CALL_S)
        except self.ray.exceptions.GetTimeoutError:
            raise ClusterError(f"Ray actors did not {what} within {CALL_S:g} s (a node overloaded or gone?)") from None
        except self.ray.exceptions.RayError as e:
            raise ClusterError(f"Ray actors could not {what}: {_first_line(e)}") from None

    def close(self) -> None:
        """Kill this job's actors, remove its placement group, and shut Ray down if this job started it."""
        for actor in self.actors:
            try:
                self.ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already dead, or the cluster is gone: nothing left to end
                pass
        self.actors = []
        if self.pg is not None:
            try:
                from ray.util.placement_group import remove_placement_group
                remove_placement_group(self.pg)
            except Exception:  # noqa: BLE001 - as above
                pass
            self.pg = None
        if self.connected:   # stops the instance this job started; only disconnects from a cluster it attached to
            self.ray.shutdown()
            self.started = self.connected = False


def _local_resources(cfg: LaunchConfig) -> dict:
    """ray.init's resources for a job-owned instance: exactly the bundles (a CPU count of at least one)."""
    total = {name: amount * cfg.nproc for name, amount in cfg.rank_resources}
    custom = {k: v for k, v in total.items() if k not in ("CPU", "GPU")}
    return {"num_cpus": max(1, int(-(-total.get("CPU", 0) // 1))), "num_gpus": int(-(-total.get("GPU", 0) // 1)),
            **({"resources": custom} if custom else {})}


def _bundle_text(resources: dict) -> str:
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(resources.items())
                           if not k.startswith(("node:", "memory", "object_store_memory"))) + "}"


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def driver_env() -> dict[str, str]:
    """The driver's variables that travel to the ranks: PYPTO_* (the runtime's knobs) and the thread-count ones;
    the rest of a rank's environment is its node's (set it on the cluster, as Ray's runtime_env would). Thread
    counts a launcher chose for the driver (it is a launched rank: PYPTO_THREADS_SET names them) are its host's
    share, not the user's: they stay behind, and each rank gets its node's share (contract.rank_env)."""
    keep = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "PYTHONPATH")
    chosen = {contract.THREADS_SET, *contract.launcher_threads(os.environ)}
    return {k: v for k, v in os.environ.items() if (k.startswith("PYPTO_") or k in keep) and k not in chosen}
