"""Errors a serving engine's user can cause: a request that can never fit, a pool too small, a bad config.

Imports only pypto_rt.errors.
"""
from __future__ import annotations

from pypto_rt.errors import PyptoError, Span, user_span


class ServingError(PyptoError):
    """Base of the serving errors: says what is wrong, for which request, and what to change; it points at the
    user's line that led to it (the innermost frame outside pypto_rt, e.g. the `add_request` call)."""

    def __init__(self, message: str, span: Span | None = None, hint: str | None = None):
        super().__init__(message, span if span is not None else user_span(2), hint)


class ServingConfigError(ServingError):
    """An `EngineConfig` (or runner/scheduler setting) that cannot work: a budget below the batch, bad buckets."""


class RequestTooLargeError(ServingError):
    """A request that can never be served: longer than max_model_len, or needing more KV blocks than the pool
    holds even when no other request is running."""


class PoolExhaustedError(ServingError):
    """The KV block pool has fewer free blocks than asked for (the scheduler preempts instead of raising)."""
