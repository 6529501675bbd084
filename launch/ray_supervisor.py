"""The driver's watch over a `--backend ray` job: poll every rank's actor, stream its output, notice the first
failure (a rank's exit, or its actor or node dying) or a signal to the launcher, and end every rank.

The same steps, timings and invariants as the local `supervisor`: on a failure the others get WAIT_SETTLE_S when
the failure carries a wait report, are asked for their stacks (SIGUSR1), then SIGTERM, SIGKILL after GRACE_S.
Every wait has a deadline: a poll round is bounded by ANSWER_S, and an actor that does not answer within it is
taken for dead (its node hung or gone), as one that Ray reports dead is.
"""
from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field

from pypto_rt.launch.output import RankStream
from pypto_rt.launch.supervisor import GRACE_S, POLL_S, REAP_S, STACK_S

ANSWER_S = 20.0   # an actor silent this long in one poll round is taken for dead
DRAIN_S = 2.0     # output still in flight once every rank has ended


@dataclass
class RemoteRank:
    """One rank as the driver sees it: its actor, where it runs, its output streams and its end."""
    rank: int
    local_rank: int
    node: int
    actor: object
    streams: dict
    pid: int = 0
    returncode: int | None = None
    ended_at: float | None = None
    drained: bool = False
    lost: str | None = None          # why its actor is gone (dead, or silent past ANSWER_S)
    signalled: int | None = None
    signalled_at: float | None = None


@dataclass
class RaySupervisor:
    ranks: list[RemoteRank]
    ray: object
    watch: object                    # SignalWatch
    on_exit: object = None           # called once with each rank seen to end while the job runs
    _reported: set = field(default_factory=set)

    def alive(self) -> list[RemoteRank]:
        return [r for r in self.ranks if r.returncode is None]

    def run(self) -> int | None:
        """Until every rank has ended, or one failed, or the launcher got a signal (returned)."""
        while True:
            if self.watch.pending:
                return self.watch.pending[0]
            self.poll()
            if any(r.returncode not in (None, 0) for r in self.ranks) or not self.alive():
                return None
            time.sleep(POLL_S)

    def poll(self, ranks: list[RemoteRank] | None = None) -> None:
        """One round: every live (or not yet drained) rank's output and end."""
        ranks = [r for r in (ranks or self.ranks) if r.lost is None and not (r.returncode is not None and r.drained)]
        refs = {r.actor.poll.remote(): r for r in ranks}
        ready, late = self.ray.wait(list(refs), num_returns=len(refs), timeout=ANSWER_S) if refs else ([], [])
        for ref in ready:
            try:
                self._take(refs[ref], self.ray.get(ref))
            except self.ray.exceptions.RayError as e:
                self._lose(refs[ref], f"its Ray actor died ({_first_line(e)})")
        for ref in late:
            self._lose(refs[ref], f"its Ray actor did not answer for {ANSWER_S:g} s (its node hung or gone)")

    def _take(self, r: RemoteRank, state: dict) -> None:
        for kind in ("stdout", "stderr"):
            if state[kind]:
                r.streams[kind].feed(state[kind])
        if state["returncode"] is not None and r.returncode is None:
            r.returncode, r.ended_at = state["returncode"], state["ended_at"] or time.time()
            self._exited(r)
        r.drained = state["drained"]

    def _lose(self, r: RemoteRank, why: str) -> None:
        r.lost = why
        if r.returncode is None:
            r.returncode, r.ended_at = -signal.SIGKILL, time.time()
            self._exited(r)
        r.drained = True

    def _exited(self, r: RemoteRank) -> None:
        if self.on_exit is not None and r.rank not in self._reported:
            self._reported.add(r.rank)
            self.on_exit(r)

    # ---- ending
    def end(self, settle_s: float = 0.0, dump_stacks: bool = False) -> None:
        """Let ranks finish for `settle_s`, ask those left for their stacks, SIGTERM, SIGKILL after GRACE_S; then
        copy their last output. A signal to the launcher meanwhile skips to the next, harder step."""
        if settle_s > 0:
            self._wait_for_ranks(settle_s)
        if dump_stacks and self.alive():
            self._call_alive("dump_stacks", STACK_S + ANSWER_S)
        self._signal_alive(signal.SIGTERM)
        if not self._wait_for_ranks(GRACE_S):
            self._signal_alive(signal.SIGKILL)
            self._wait_for_ranks(REAP_S)
        deadline = time.monotonic() + DRAIN_S
        while any(not r.drained for r in self.ranks) and time.monotonic() < deadline:
            self.poll()
            time.sleep(0.05)
        for r in self.ranks:
            for stream in r.streams.values():
                stream.close()

    def _wait_for_ranks(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        signals = len(self.watch.pending)
        while True:
            self.poll()
            if not self.alive() or time.monotonic() >= deadline or len(self.watch.pending) > signals:
                return not self.alive()
            time.sleep(POLL_S)

    def _signal_alive(self, sig: int) -> None:
        alive = self.alive()
        sent = self._call_alive("signal", ANSWER_S, sig)
        now = time.time()
        for r, was_sent in zip(alive, sent):
            if was_sent:
                r.signalled, r.signalled_at = sig, r.signalled_at or now

    def _call_alive(self, method: str, timeout: float, *args) -> list:
        """Call `method` on every live rank's actor, at most `timeout` s in all; each answer, False when none."""
        alive = self.alive()
        refs = [getattr(r.actor, method).remote(*args) for r in alive]
        self.ray.wait(refs, num_returns=len(refs), timeout=timeout)
        answers = []
        for ref in refs:
            try:
                answers.append(self.ray.get(ref, timeout=0))
            except self.ray.exceptions.RayError:   # dead or still silent: the next poll says which
                answers.append(False)
        return answers


def streams(rank: int, echo: bool, logs: tuple) -> dict:
    """The rank's stdout/stderr streams: `[rank N]` lines to the terminal (with echo) and raw bytes to its logs."""
    return {kind: RankStream(rank, kind, echo, log) for kind, log in zip(("stdout", "stderr"), logs)}


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
