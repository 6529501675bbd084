"""What a serving engine integrates (issue 15): the KV block manager, the scheduler (continuous batching,
chunked prefill), the model runner and metrics. `ForwardBatch` (batch.py) is the one step's input that the
runner builds and the model consumes.

The host side (every module here but `model/`) imports only `pypto_rt.errors` and its own modules: the model
is handed to the engine, never imported (tests/serving/test_package.py checks it).

`Engine` is the issue's name for `ServingEngine` (the class is named apart from the task engine,
`pypto_rt.aicpu.engine.Engine`, so that the two never read as one)."""
from pypto_rt.serving.batch import ForwardBatch
from pypto_rt.serving.block_manager import KVCacheManager
from pypto_rt.serving.metrics import ServingMetrics
from pypto_rt.serving.model_runner import ModelRunner, ServingModel
from pypto_rt.serving.rank_group import RankGroup
from pypto_rt.serving.request import Request, RequestStatus
from pypto_rt.serving.scheduler import ScheduledStep, Scheduler
from pypto_rt.serving.serving_engine import EngineConfig, ServingEngine
from pypto_rt.serving.serving_errors import PoolExhaustedError, RequestTooLargeError, ServingConfigError, ServingError

Engine = ServingEngine

__all__ = ["Engine", "EngineConfig", "ForwardBatch", "KVCacheManager", "ModelRunner", "PoolExhaustedError", "RankGroup",
           "Request", "RequestStatus", "RequestTooLargeError", "ScheduledStep", "Scheduler", "ServingConfigError",
           "ServingEngine", "ServingError", "ServingMetrics", "ServingModel"]
