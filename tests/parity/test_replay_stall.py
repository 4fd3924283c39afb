"""The replay loop's stall rule, with a scripted engine: a step that preempted and scheduled
nothing is not a stall when the next step schedules; two in a row are. The golden case
`priority_self_preempt` holds such steps as vLLM 0.23 ran them."""

from __future__ import annotations

import pytest

from pagesim.parity import golden_files
from pagesim.parity.decisions import DecisionLog
from pagesim.parity.replay import ReplayError, StepObservation, replay
from pagesim.parity.workloads import ParityRequest, ParityWorkload


class ScriptedEngine:
    """Answers `step()` from a script of (scheduled, preempted, finished) triples."""

    def __init__(self, script):
        self.script = list(script)
        self.unfinished = 0

    def add_request(self, request, prompt_token_ids, arrival_step) -> None:
        self.unfinished += 1

    def step(self) -> StepObservation:
        scheduled, preempted, finished = self.script.pop(0)
        self.unfinished -= len(finished)
        return StepObservation(
            scheduled=scheduled,
            hits=[],
            preempted=preempted,
            block_tables={rid: [1] for rid, _ in scheduled},
            finished=finished,
            evicted=[],
            free_queue=[2, 3],
        )

    def has_unfinished_requests(self) -> bool:
        return self.unfinished > 0

    def free_queue(self) -> list[int]:
        return [1, 2, 3]


def workload() -> ParityWorkload:
    request = ParityRequest("a", (("k", 1, 4),), max_tokens=1)
    return ParityWorkload("stall", 0, (request,), {})


def test_a_self_preemption_followed_by_a_scheduled_step_is_not_a_stall():
    engine = ScriptedEngine([([("a", 4)], [], []), ([], ["a"], []), ([("a", 4)], [], ["a"])])
    log = replay(workload(), engine, {}, "0.23")
    assert [s.t for s in log.steps] == [0, 1, 2]
    assert log.steps[1].preempted == ["a"] and log.steps[1].scheduled == []


def test_two_preempting_steps_that_schedule_nothing_are_a_stall():
    engine = ScriptedEngine([([("a", 4)], [], []), ([], ["a"], []), ([], ["a"], [])])
    with pytest.raises(ReplayError, match="nothing can be scheduled"):
        replay(workload(), engine, {}, "0.23")


def test_a_step_that_decides_nothing_is_a_stall():
    engine = ScriptedEngine([([("a", 4)], [], []), ([], [], [])])
    with pytest.raises(ReplayError, match="nothing can be scheduled"):
        replay(workload(), engine, {}, "0.23")


def test_the_self_preemption_golden_holds_steps_that_only_preempt():
    """vLLM 0.23 really runs such steps on `priority_self_preempt`: the golden file (replayed
    in test_parity) keeps the stall rule honest against the real scheduler."""
    path = next(p for p in golden_files() if p.name == "priority_self_preempt.vllm-0.23.0.json.gz")
    log = DecisionLog.read(path)
    only_preempt = [s.t for s in log.steps if s.preempted and not s.scheduled]
    assert len(only_preempt) == 3
    after = {s.t: s for s in log.steps}
    assert all(after[t + 1].scheduled for t in only_preempt)
