"""`ServingEngine(model, config)` (exported as `pypto_rt.serving.Engine`): greedy serving of a stream of requests
on one rank.

A step schedules (`scheduler`), runs the model once over the padded batch (`model_runner`), appends each finished
prefill's or decode's token, records newly full blocks in the prefix cache and retires the requests that reached
max_new_tokens or their eos id. The engine calls the model exactly once per step, an empty step included: with
attention data-parallel and experts expert-parallel, every rank must step until every rank is done, so
`run`/`generate` take `done_everywhere(local_done) -> bool` (an all-reduce the caller supplies) and keep
stepping, empty, while another rank still works.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence, TextIO

from pypto_rt.serving.block_manager import KVCacheManager, cdiv
from pypto_rt.serving.metrics import ServingMetrics
from pypto_rt.serving.model_runner import ModelRunner, ServingModel
from pypto_rt.serving.request import Request, RequestStatus
from pypto_rt.serving.scheduler import ScheduledStep, Scheduler
from pypto_rt.serving.serving_errors import ServingConfigError, ServingError


@dataclass(frozen=True)
class EngineConfig:
    num_blocks: int = 256                  # KV blocks of this rank's pool (ids are rank-local)
    max_batch: int = 32                    # running requests (batch rows) at most
    max_num_batched_tokens: int = 256      # tokens fed per step at most (decodes + prefill chunks)
    max_model_len: int = 2048              # prompt + output tokens of one request at most
    enable_prefix_caching: bool = True
    decode_buckets: Sequence[int] | None = None    # padded batch sizes; default 1, 2, 4, ..., max_batch
    prefill_buckets: Sequence[int] | None = None   # padded prefill token counts; default 16, 32, ..., budget
    eos_id: int | None = None              # default stop token of requests that give none
    warmup: bool = True                    # one all-padding decode and prefill step at start
    compile_kernels: bool = False          # warm-up also compiles every decode bucket's kernels (ModelRunner;
                                           # opt-in: seconds per shape, minutes with a cold compiler cache)
    progress_interval_s: float | None = None   # print a progress line this often (None: never)

    def check(self) -> None:
        for name in ("num_blocks", "max_batch", "max_num_batched_tokens", "max_model_len"):
            if getattr(self, name) < 1:
                raise ServingConfigError(f"EngineConfig.{name} must be >= 1, got {getattr(self, name)}")


class ServingEngine:
    def __init__(self, model: ServingModel, config: EngineConfig = EngineConfig(), *,
                 clock: Callable[[], float] = time.perf_counter, progress_stream: TextIO | None = None):
        config.check()
        if not isinstance(model, ServingModel):
            raise ServingConfigError(
                f"{type(model).__name__} is not a ServingModel: it lacks one of block_size, "
                f"allocate_kv_cache(num_blocks), forward(batch)", hint="see pypto_rt.serving.ServingModel")
        self.model, self.config, self.clock = model, config, clock
        self.kv = KVCacheManager(config.num_blocks, model.block_size, config.max_batch,
                                 cdiv(config.max_model_len, model.block_size), config.max_num_batched_tokens,
                                 config.enable_prefix_caching)
        self.scheduler = Scheduler(self.kv, config.max_num_batched_tokens)
        model.allocate_kv_cache(config.num_blocks)
        self.runner = ModelRunner(model, self.kv.table, max_batch=config.max_batch,
                                  max_num_tokens=config.max_num_batched_tokens,
                                  decode_buckets=config.decode_buckets, prefill_buckets=config.prefill_buckets)
        self.metrics = ServingMetrics(clock)
        self.progress_stream = progress_stream or sys.stdout
        self._last_progress = clock()
        self._next_id = 0
        reports_experts = hasattr(model, "on_expert_counts")   # a MoE model reports its tokens per expert
        if config.warmup:
            if reports_experts:                  # (the warm-up's dummy rows are no traffic: not counted)
                model.on_expert_counts = lambda counts, layer: None
            self.runner.warmup(config.compile_kernels, pool_slots=config.num_blocks * model.block_size)
        if reports_experts:
            model.on_expert_counts = self.metrics.record_expert_tokens

    def add_request(self, prompt_ids: Sequence[int], max_new_tokens: int, *, eos_id: int | None = None,
                    request_id: int | None = None) -> Request:
        """Queue a request; it joins the batch at the next step with room. Raises if it can never fit."""
        prompt = [int(t) for t in prompt_ids]
        rid = self._next_id if request_id is None else request_id
        if not prompt or max_new_tokens < 1:
            raise ServingError(f"request {rid}: needs a non-empty prompt and max_new_tokens >= 1 "
                               f"(got {len(prompt)} prompt tokens, max_new_tokens={max_new_tokens})")
        self._next_id = max(self._next_id, rid + 1) if isinstance(rid, int) else self._next_id + 1
        req = Request(rid, prompt, max_new_tokens, self.config.eos_id if eos_id is None else eos_id,
                      arrival_time=self.clock())
        self.scheduler.add(req)
        return req

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list[Request]:
        """One scheduling step and one model call (empty when this rank has nothing to run); returns the
        requests that finished in it."""
        sched = self.scheduler.schedule()
        start = self.clock()
        tokens = self.runner.execute(sched).tolist()
        now = self.clock()
        finished, new = self._update(sched, tokens, now)
        m = self.metrics
        m.preemptions += len(sched.preempted)
        m.prefix_hit_tokens, m.prefix_queried_tokens = self.kv.prefix_hit_tokens, self.kv.prefix_queried_tokens
        m.on_step(sched.num_live_rows, sched.num_tokens, new, now - start)
        for req in finished:
            m.on_finish(req)
        self._maybe_progress(now)
        return finished

    def _update(self, sched: ScheduledStep, tokens: list[int], now: float) -> tuple[list[Request], int]:
        """Advance each row by its fed tokens; a row that reached its end outputs the model's token."""
        finished, new, bs = [], 0, self.kv.block_size
        for (req, n), token in zip(sched.rows, tokens):
            if not n:
                continue
            computed = req.num_computed_tokens = req.num_computed_tokens + n
            ids = req.token_ids
            done = False
            if computed == len(ids):
                ids.append(token)
                new += 1
                if req.first_token_time is None:
                    req.first_token_time = now
                done = len(ids) >= req.max_total_tokens or token == req.eos_id
            if n > 1 and computed // bs > req.num_cached_blocks:
                self.kv.cache_computed(req)       # a chunk filled blocks: findable by the next admissions
            # (a decode's full block is recorded when its request takes the next block, or is freed)
            if done:
                req.finish_time = now
                self.scheduler.finish(req)
                finished.append(req)
        return finished, new

    def _maybe_progress(self, now: float) -> None:
        interval = self.config.progress_interval_s
        if interval is not None and now - self._last_progress >= interval:
            self._last_progress = now
            print(self.metrics.progress_line(len(self.scheduler.waiting), len(self.kv.rows)),
                  file=self.progress_stream, flush=True)

    def generate(self, done_everywhere: Callable[[bool], bool] | None = None) -> Iterator[Request]:
        """Step until no request is left (on every rank, when `done_everywhere` is given), yielding each
        request as it finishes."""
        while True:
            local_done = not self.has_unfinished()
            if (done_everywhere(local_done) if done_everywhere is not None else local_done):
                return
            yield from self.step()

    def run(self, done_everywhere: Callable[[bool], bool] | None = None) -> list[Request]:
        """Serve every queued request; returns them in the order they finished."""
        return list(self.generate(done_everywhere))

