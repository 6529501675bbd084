"""One `--backend ray` job: Ray places one actor per rank, each starts its rank process as the local backend does;
this driver hosts the store, watches the ranks, reports, and cleans up on every node.

Layout: ranks are grouped by Ray node id (simulated nodes on one host share an IP, never an id); nodes are
numbered by their lowest rank, a rank's LOCAL_RANK counts the ranks of its node. With several nodes each node
gets its own shared-memory namespace (`contract.shm_prefix(job, node)`) and PYPTO_RANK_NODES.

Store: the driver hosts it on loopback (as torchrun's agent does): ranks on the driver's node join it there; ranks
on other nodes through a relay in their actor to the driver's gateway, on the address Ray reports for the
driver's node, which admits only holders of the job's secret. Ownership: every node's `<prefix>+*` segments are
removed on that node by its actors' `cleanup`, and the driver removes any left on its own node; the actors,
placement group and (when the job started it) Ray itself are gone when `run_ray_job` returns.
"""
from __future__ import annotations

import os

from pypto_rt.launch import contract, files
from pypto_rt.launch.config import LaunchConfig
from pypto_rt.launch.job import WAIT_SETTLE_S, _ending
from pypto_rt.launch.job_segments import remove_segments
from pypto_rt.launch.job_store import LOOPBACK
from pypto_rt.launch.ray_cluster import Cluster, ClusterError, driver_env
from pypto_rt.launch.ray_supervisor import RaySupervisor, RemoteRank, streams
from pypto_rt.launch.report import RankResult, first_failure
from pypto_rt.launch.result import JobResult, job_result
from pypto_rt.launch.signals import SignalWatch

CLEANUP_S = 10.0   # longest wait for the actors' clean-up before they are killed


def run_ray_job(cfg: LaunchConfig) -> JobResult:
    """Run the job `cfg` describes on Ray to its end; returns its result (as `job.run_job`)."""
    cluster = job_store = nodes = None
    try:
        if cfg.log_dir:
            try:
                os.makedirs(cfg.log_dir, mode=0o755, exist_ok=True)
                files.check_folder(cfg.log_dir)
            except (files.UnsafeFolder, OSError) as e:
                return _setup_error(cfg, f"cannot use the log folder --log-dir {cfg.log_dir}: {e}")
        cluster = Cluster(cfg)
        cluster.place()
        actors = cluster.make_actors()
        wheres = cluster.get([a.where.remote() for a in actors], "start")
        nodes = _nodes(wheres)
        job_store = _store(cfg, wheres, cluster.node_id())
        ranks = _start(cfg, cluster, nodes, wheres, job_store)
        with SignalWatch() as watch:
            return _supervise(cfg, cluster, ranks, watch, job_store)
    except ClusterError as e:
        return _setup_error(cfg, str(e))
    finally:
        _cleanup(cfg, cluster, nodes)
        if job_store is not None:
            for held in job_store:
                held.close()


def _nodes(wheres: list[dict]) -> list[int]:
    """Each rank's node index: nodes numbered in order of their lowest rank."""
    order: dict[str, int] = {}
    return [order.setdefault(w["node_id"], len(order)) for w in wheres]


def _prefix(cfg: LaunchConfig, nodes: list[int], rank: int) -> str:
    return contract.shm_prefix(cfg.job_id, nodes[rank] if max(nodes) > 0 else None)


def _store(cfg: LaunchConfig, wheres: list[dict], driver_node: str) -> list:
    """Host the job's store on loopback, and a gateway to it on the driver node's address when a rank runs on
    another node; returns [server, gateway?], the store's job scope and port in `server.scope`/`server.port`."""
    from pypto_rt.launch.job_store import StoreError, host_store
    try:
        server, scope, port = host_store(LOOPBACK, 0, cfg.secret)
    except StoreError as e:
        raise ClusterError(str(e)) from None
    held = [_Held(server, scope, port)]
    if any(w["node_id"] != driver_node for w in wheres):
        from pypto_rt.launch.gateway import gateway
        import ray
        address = ray.util.get_node_ip_address()
        try:
            held.append(gateway(address, 0, port, cfg.secret))
        except OSError as e:
            raise ClusterError(f"cannot listen on {address} (this node's address in Ray) for the ranks of other "
                               f"nodes: {e.strerror or e}") from None
        held[0].gateway = (address, held[1].port)
    return held


class _Held:
    """The store server with its job scope and port (and the gateway's address, when there is one)."""

    def __init__(self, server, scope, port: int):
        self.server, self.scope, self.port, self.gateway = server, scope, port, None

    def close(self) -> None:
        if hasattr(self.server, "close"):
            self.server.close()
        self.scope = None


def _start(cfg: LaunchConfig, cluster: Cluster, nodes: list[int], wheres: list[dict], held: list
           ) -> list[RemoteRank]:
    store, driver_node = held[0], cluster.node_id()
    argv = ["-m", "pypto_rt.launch.rank_main", *(["-m"] if cfg.module else []), cfg.target, *cfg.args]
    passed, several = driver_env(), max(nodes) > 0
    ranks, refs = [], []
    for rank, (actor, where) in enumerate(zip(cluster.actors, wheres)):
        peers = [r for r in range(cfg.nproc) if nodes[r] == nodes[rank]]
        local_rank = peers.index(rank)
        keywords = {"rank": rank, "local_rank": local_rank, "world_size": cfg.nproc, "local_world_size": len(peers),
                    "master_addr": LOOPBACK, "master_port": store.port, "comm": cfg.comm, "job_id": cfg.job_id,
                    "timeout_s": cfg.timeout_s, "node": nodes[rank] if several else None,
                    "rank_nodes": nodes if several else None}
        gateway = store.gateway if where["node_id"] != driver_node else None
        refs.append(actor.start.remote(argv, keywords, passed, os.getcwd(), gateway, cfg.secret))
        ranks.append(RemoteRank(rank, local_rank, nodes[rank], actor, streams(rank, cfg.tee or not cfg.log_dir,
                                                                              _logs(cfg, rank))))
    for r, pid in zip(ranks, cluster.get(refs, "start their ranks")):
        r.pid = pid
    return ranks


def _logs(cfg: LaunchConfig, rank: int) -> tuple:
    """The rank's log files in --log-dir (made anew), after removing a previous job's files it brings back."""
    if not cfg.log_dir:
        return (None, None)
    try:
        for stale in (f"rank{rank}.error.json", f"rank{rank}.stack.txt", contract.RESULT_FILE.format(rank=rank)):
            files.remove(os.path.join(cfg.log_dir, stale))
        return tuple(files.create(os.path.join(cfg.log_dir, f"rank{rank}.{kind}.log")) for kind in ("stdout", "stderr"))
    except OSError as e:
        raise ClusterError(f"cannot write rank {rank}'s files in --log-dir {cfg.log_dir}: {e.strerror or e}") from None


def _supervise(cfg: LaunchConfig, cluster: Cluster, ranks: list[RemoteRank], watch, held: list) -> JobResult:
    from pypto_rt.collective.store_rendezvous import EXITED_KEY
    scope = held[0].scope

    def mark_exited(r: RemoteRank) -> None:   # ranks still in a start rendezvous learn r will never come
        try:
            scope.set(f"{EXITED_KEY}/{r.rank}", str(r.returncode))
        except Exception:  # noqa: BLE001 - the store is closing: the ranks are ending anyway
            pass

    sup = RaySupervisor(ranks, cluster.ray, watch, on_exit=mark_exited)
    got_signal = sup.run()
    outcomes = _outcomes(cluster, ranks)
    first = first_failure([_result(cfg, r, outcomes[r.rank]) for r in ranks if r.returncode is not None])
    sup.end(settle_s=WAIT_SETTLE_S if first and first.record and first.record.get("wait") else 0.0,
            dump_stacks=first is not None)
    outcomes = _outcomes(cluster, ranks)
    results = [_result(cfg, r, outcomes[r.rank]) for r in ranks]
    _bring_back(cfg, ranks, outcomes)
    code, report = _ending(cfg, results, got_signal, None)
    return job_result(code, cfg.job_id, results, first_failure(results), got_signal, report)


def _outcomes(cluster: Cluster, ranks: list[RemoteRank]) -> dict[int, dict]:
    """Each rank's error record, stacks and files, from its actor (an empty one for a lost actor)."""
    extra = tuple(contract.RESULT_FILE.format(rank=r.rank) for r in ranks)
    found = {}
    for r in ranks:
        empty = {"record": None, "stack": "", "left_processes": False, "files": {}}
        if r.lost is not None:
            found[r.rank] = empty
            continue
        try:
            found[r.rank] = cluster.get([r.actor.outcome.remote(extra)], "report their ranks")[0]
        except ClusterError:
            found[r.rank] = empty
    return found


def _result(cfg: LaunchConfig, r: RemoteRank, outcome: dict) -> RankResult:
    record = outcome["record"]
    if record is None and r.lost is not None:
        record = {"message": f"rank {r.rank} (node {r.node}) ended: {r.lost}", "time": r.ended_at}
    log = os.path.join(cfg.log_dir, f"rank{r.rank}.stderr.log") if cfg.log_dir else None
    return RankResult(rank=r.rank, local_rank=r.local_rank, pid=r.pid, returncode=r.returncode, ended_at=r.ended_at,
                      signalled=r.signalled, signalled_at=r.signalled_at, record=record, log=log,
                      left_processes=outcome["left_processes"], stack=outcome["stack"] or None,
                      stderr_tail=r.streams["stderr"].tail.decode("utf-8", "replace"))


def _bring_back(cfg: LaunchConfig, ranks: list[RemoteRank], outcomes: dict[int, dict]) -> None:
    """With --log-dir, each rank's error record, stacks and result files land there, as the local backend's."""
    if not cfg.log_dir:
        return
    for r in ranks:
        out = outcomes[r.rank]
        texts = dict(out["files"])
        if out["record"] is not None:
            import json
            texts[f"rank{r.rank}.error.json"] = json.dumps(out["record"]).encode()
        if out["stack"]:
            texts[f"rank{r.rank}.stack.txt"] = out["stack"].encode()
        for name, data in texts.items():
            with files.create(os.path.join(cfg.log_dir, name)) as f:
                f.write(data)


def _cleanup(cfg: LaunchConfig, cluster: Cluster | None, nodes: list[int] | None) -> None:
    """Every actor removes its node's segments and ends what is left of its rank; then actors, placement group
    and (if this job started it) Ray go; the driver's node is swept too (its actors may have died)."""
    prefixes = {_prefix(cfg, nodes, rank) for rank in range(cfg.nproc)} if nodes else {contract.shm_prefix(cfg.job_id)}
    if cluster is not None and cluster.actors and nodes:
        refs = [actor.cleanup.remote(_prefix(cfg, nodes, rank)) for rank, actor in enumerate(cluster.actors)]
        cluster.ray.wait(refs, num_returns=len(refs), timeout=CLEANUP_S)
    if cluster is not None:
        cluster.close()
    for prefix in prefixes:
        remove_segments(prefix)


def _setup_error(cfg: LaunchConfig, message: str) -> JobResult:
    return JobResult(2, cfg.job_id, report=f"pypto-launch: {message}")
