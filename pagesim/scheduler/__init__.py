"""vLLM v1's scheduling model over the shared KV-cache core (no SimPy, no torch)."""

from pagesim.scheduler.output import ModelRunnerOutput, SchedulerOutput, synthetic_token
from pagesim.scheduler.preemption import CPUSwapPool
from pagesim.scheduler.scheduler import Scheduler

__all__ = ["CPUSwapPool", "ModelRunnerOutput", "Scheduler", "SchedulerOutput", "synthetic_token"]
