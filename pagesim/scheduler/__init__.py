"""vLLM v1's scheduling model over the shared KV-cache core (no SimPy, no torch)."""

from pagesim.scheduler.output import (
    ModelRunner,
    ModelRunnerOutput,
    ScheduledRequest,
    SchedulerOutput,
    synthetic_token,
)
from pagesim.scheduler.preemption import CPUSwapPool, SchedulerStats
from pagesim.scheduler.request_queue import (
    FCFSRequestQueue,
    PriorityRequestQueue,
    create_request_queue,
)
from pagesim.scheduler.scheduler import Scheduler

__all__ = [
    "CPUSwapPool",
    "FCFSRequestQueue",
    "ModelRunner",
    "ModelRunnerOutput",
    "PriorityRequestQueue",
    "ScheduledRequest",
    "Scheduler",
    "SchedulerOutput",
    "SchedulerStats",
    "create_request_queue",
    "synthetic_token",
]
