"""The simulator's model runner: a step's time comes from a cost model, not from a GPU.

It implements the same `ModelRunner` protocol as `pagesim.gpu.runner.GPUModelRunner`, so the
scheduler cannot tell a simulated step from a real one.
"""

from __future__ import annotations

from pagesim.cost.base import BatchShape, CostModel
from pagesim.scheduler.output import ModelRunnerOutput, SchedulerOutput, synthetic_token


class CostModelRunner:
    """Executes a step by asking the cost model how long it takes."""

    def __init__(self, cost_model: CostModel, vocab_size: int = 32000) -> None:
        self.cost_model = cost_model
        self.vocab_size = vocab_size

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        step_time_s = self.cost_model.step_time(BatchShape.from_scheduler_output(scheduler_output))
        sampled: dict[str, int] = {}
        vocab = self.vocab_size
        for sr in scheduler_output.scheduled:
            req = sr.request
            # A request samples when this step brings its K/V up to all its tokens; a prefill
            # chunk that stops inside the prompt samples nothing.
            output = req.output_token_ids
            if sr.num_computed_tokens + sr.num_new_tokens >= len(req.prompt_token_ids) + len(output):
                sampled[req.request_id] = synthetic_token(req, len(output), vocab)
        return ModelRunnerOutput(step_time_s=step_time_s, sampled_token_ids=sampled)
