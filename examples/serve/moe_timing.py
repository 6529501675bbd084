"""Where the model's forward goes: the MoE layers (router, gate, dispatch, routed and shared experts, combine,
with any wait for the other ranks inside dispatch/combine) against the rest (embedding, norms, attention, linear
layers, LM head). `time_moe_layers(model)` wraps each of `MoEDecoder`'s layers in a timer that forwards every
other attribute, so the decoder calls and reads them as before."""
from __future__ import annotations

import time


class MoETimer:
    def __init__(self):
        self.seconds = 0.0


class TimedMoELayer:
    def __init__(self, layer, timer: MoETimer):
        self._layer, self._timer = layer, timer

    def __call__(self, x):
        start = time.perf_counter()
        try:
            return self._layer(x)
        finally:
            self._timer.seconds += time.perf_counter() - start

    def __getattr__(self, name):
        return getattr(self._layer, name)


def time_moe_layers(model) -> MoETimer:
    """Time every MoE layer call of `model` (a MoEDecoder) from now on; the timer sums their seconds."""
    timer = MoETimer()
    model.moe = [TimedMoELayer(layer, timer) for layer in model.moe]
    return timer
