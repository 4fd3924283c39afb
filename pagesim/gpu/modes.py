"""What a calibration or a served run measured, named the same way in both (no torch).

A profile stores its attention backend and runner mode in `ProfileMetadata.attention_backend`
(`backend_description`); a real run stores its runner mode in `result["gpu_runner"]`. A
profile prices the runner it was measured with: the runner's host work is part of every step
it timed. `pagesim validate` compares the two and says when they differ.
"""

from __future__ import annotations

ATTENTION_BACKEND = (
    "pagesim Triton paged attention: reshape_and_cache, split-K decode, varlen prefill"
)
_GRAPHS = (
    "CUDA graphs: decode-only steps padded to a captured batch (forward + LM head in "
    "the graph), other steps of <= 512 tokens padded to a captured token count (forward "
    "to the final norm in the graph, LM head eager); sampler eager; larger steps eager"
)
#: The runner's mode, by whether CUDA graphs are on.
RUNNER_MODES = {
    True: f"{_GRAPHS}; graph-step inputs staged in one pinned buffer, block-table "
    "rows kept across steps",
    False: "eager (no CUDA graphs, --enforce-eager)",
}
#: Short names of the modes profiles and runs have been measured with.
RUNNER_LABELS = {
    RUNNER_MODES[True]: "CUDA graphs, staged inputs",
    _GRAPHS: "CUDA graphs, inputs rebuilt each step",
    RUNNER_MODES[False]: "eager",
}
_SEPARATOR = "; runner: "


def backend_description(cuda_graphs: bool) -> str:
    """A profile's `attention_backend`: the kernels and the runner mode it timed."""
    return f"{ATTENTION_BACKEND}{_SEPARATOR}{RUNNER_MODES[cuda_graphs]}"


def profile_runner(attention_backend: str) -> str | None:
    """The runner mode a profile names, or None if it names none."""
    if _SEPARATOR not in attention_backend:
        return None
    return attention_backend.split(_SEPARATOR, 1)[1]


def runner_label(mode: str) -> str:
    """A runner mode's short name (`RUNNER_LABELS`; an older mode's first words)."""
    return RUNNER_LABELS.get(mode) or mode.split(";")[0][:60]
