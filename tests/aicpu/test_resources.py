"""Engine resources: each runtime's engines share one lock and worker pool; workers read their run's knobs."""
from __future__ import annotations

import threading

from pypto_rt import config
from pypto_rt.aicpu import Engine
from pypto_rt.aicpu.resources import DEFAULT, EngineResources, current, use


def _note_knob(seen: dict):
    def run(block):
        seen[block] = (config.STATS.get(), threading.current_thread().name)
    return run


def test_workers_read_the_knob_overrides_of_the_run_they_serve(monkeypatch):
    monkeypatch.delenv("PYPTO_STATS", raising=False)
    seen = {}
    with config.scope(STATS="1", HOST_INLINE_US="0"), Engine(num_workers=2, stats=False) as e:
        e.submit("note", _note_knob(seen), blocks=4)
        e.finish()
    assert {value for value, _ in seen.values()} == {"1"}
    assert any(name.startswith("pypto-rt worker") for _, name in seen.values())   # not only the host thread


def test_engines_use_the_resources_of_their_context():
    mine = EngineResources("test")
    try:
        with use(mine):
            assert current() is mine
            with Engine(num_workers=3) as e:
                e.finish()
        assert current() is DEFAULT and mine.pool_size == 3
        with Engine(num_workers=1) as e:   # the default pool's size does not touch `mine`
            e.finish()
        assert mine.pool_size == 3
    finally:
        mine.close()
    assert mine.pool_size is None
