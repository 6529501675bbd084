"""What a serving engine integrates (issue 15): the KV block manager, the scheduler (continuous batching,
chunked prefill), the model runner and metrics. `ForwardBatch` (batch.py) is the one step's input that the
runner builds and the model consumes."""
from pypto_rt.serving.batch import ForwardBatch
from pypto_rt.serving.block_manager import KVCacheManager
from pypto_rt.serving.engine import Engine, EngineConfig
from pypto_rt.serving.errors import PoolExhaustedError, RequestTooLargeError, ServingConfigError, ServingError
from pypto_rt.serving.metrics import ServingMetrics
from pypto_rt.serving.request import Request, RequestStatus
from pypto_rt.serving.runner import ModelRunner, ServingModel
from pypto_rt.serving.scheduler import ScheduledStep, Scheduler

__all__ = ["Engine", "EngineConfig", "ForwardBatch", "KVCacheManager", "ModelRunner", "PoolExhaustedError",
           "Request", "RequestStatus", "RequestTooLargeError", "ScheduledStep", "Scheduler", "ServingConfigError",
           "ServingError", "ServingMetrics", "ServingModel"]
