"""What a serving engine integrates (issue 15): the KV block manager, the scheduler (continuous batching,
chunked prefill), the model runner and metrics. `ForwardBatch` (batch.py) is the one step's input that the
runner builds and the model consumes."""
from pypto_rt.serving.batch import ForwardBatch

__all__ = ["ForwardBatch"]
