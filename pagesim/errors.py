"""Errors that pagesim raises.

Two families that must never be confused. A `PagesimError` is bad input the user can fix: it
carries a one-line message naming the offending field and value, and the CLI prints that line
and exits with code 2. An `InternalError` is a broken invariant inside pagesim's own logic (a
leaked block, counts that do not add up): a bug, which the CLI reports with its traceback and
exit code 1, so that a defect is never dressed up as the user's mistake.
"""


class PagesimError(Exception):
    """Base class: bad input that the user can fix (the CLI maps it to exit code 2)."""


class InternalError(Exception):
    """A check inside pagesim's own logic failed: a bug, not bad input (CLI exit code 1)."""


class ConfigError(PagesimError, ValueError):
    """An impossible or malformed engine, cache or scheduler setting."""


class UnknownNameError(PagesimError, KeyError):
    """A model, GPU, workload or policy name that pagesim does not know."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class WorkloadError(PagesimError, ValueError):
    """A malformed workload spec or trace file."""


class AllocationError(PagesimError, RuntimeError):
    """A request the cache as configured can never serve: more KV blocks than it can ever
    hold, or sharing its allocator cannot do. A call that breaks the allocator's contract
    (arguments that disagree, more blocks than the caller checked were free) is an
    `InternalError`: pagesim's own scheduler makes those calls."""


class GPUUnavailableError(PagesimError, RuntimeError):
    """A command that needs a CUDA GPU (or torch/triton) ran without one."""


class KernelInputError(PagesimError, ValueError):
    """A tensor handed to a GPU kernel wrapper has the wrong shape, stride, dtype or device."""


def unknown_name(kind: str, name: str, known: "list[str] | tuple[str, ...]") -> UnknownNameError:
    """Build the one-line error for a name lookup miss, listing the known names."""
    return UnknownNameError(f"unknown {kind} {name!r}; known: {', '.join(sorted(known))}")
