"""Where sweep runs execute: local processes through joblib, or a Ray cluster.

Both take a list of picklable tasks and a pure function, and yield `(task index, outcome)`
as runs finish (any order). The function is pure in its task (config + seed), so a run gives
the same outcome on any backend; the caller sorts by index, so the files written do not
depend on the completion order either.

- `local`: joblib's loky process pool, `n_jobs` workers (default: all cores), results
  unordered so that a progress bar moves as runs finish. `n_jobs=1` runs in this process.
- `ray`: Ray tasks (one CPU each) on the cluster at `address` (`auto`, `ray://host:10001`,
  or None to start a local one, as `ray.init` does); a cluster started here is shut down
  afterwards. Ray is imported only here (`pip install pagesim[ray]`).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from pagesim.errors import ConfigError

T = TypeVar("T")
R = TypeVar("R")
BACKENDS: tuple[str, ...] = ("local", "ray")


def _indexed(fn: Callable[[T], R], index: int, task: T) -> tuple[int, R]:
    return index, fn(task)


def _in_worker(fn: Callable[[T], R], index: int, task: T) -> tuple[int, R]:
    _end_with_parent()
    return index, fn(task)


def _end_with_parent() -> None:
    """In a worker process: ask the kernel to send SIGTERM when the process that started it
    dies (Linux prctl PR_SET_PDEATHSIG; a no-op elsewhere), so that a killed sweep leaves no
    workers behind. One system call, repeated per task (idempotent)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):  # pragma: no cover - no libc prctl
        pass


def execute(
    fn: Callable[[T], R],
    tasks: list[T],
    *,
    backend: str = "local",
    n_jobs: int | None = None,
    address: str | None = None,
) -> Iterator[tuple[int, R]]:
    """Run fn over tasks; yield (index, fn(tasks[index])) as each finishes."""
    if backend == "local":
        return _local(fn, tasks, n_jobs)
    if backend == "ray":
        require_ray()
        return _ray(fn, tasks, n_jobs, address)
    raise ConfigError(f"--backend {backend!r}: choose one of {', '.join(BACKENDS)}")


def _local(fn, tasks, n_jobs) -> Iterator[tuple[int, Any]]:
    if not tasks:
        return iter(())
    jobs = n_jobs or os.cpu_count() or 1
    if jobs < 1:
        raise ConfigError(f"--jobs {n_jobs}: must be >= 1")
    jobs = min(jobs, len(tasks))
    if jobs == 1:
        return (_indexed(fn, i, t) for i, t in enumerate(tasks))
    from joblib import Parallel, delayed  # type: ignore[import-untyped]

    parallel = Parallel(
        n_jobs=jobs,
        backend="loky",
        return_as="generator_unordered",
        batch_size=1,
        pre_dispatch="2*n_jobs",
    )
    return parallel(delayed(_in_worker)(fn, i, t) for i, t in enumerate(tasks))


def require_ray() -> None:
    """One-line error when Ray is missing."""
    try:
        import ray  # noqa: F401
    except ImportError:
        raise ConfigError(
            "--backend ray: ray is not installed (pip install 'pagesim[ray]')"
        ) from None


def _ray(fn, tasks, n_jobs, address) -> Iterator[tuple[int, Any]]:
    import ray

    started = False
    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
        if address is not None:
            kwargs["address"] = address
        elif n_jobs is not None:
            kwargs["num_cpus"] = n_jobs
        try:
            ray.init(**kwargs)
        except ConnectionError as exc:
            raise ConfigError(f"--address {address}: cannot join the Ray cluster ({exc})") from None
        started = True
    remote: Any = ray.remote(num_cpus=1)(_indexed)
    try:
        pending = [remote.remote(fn, i, t) for i, t in enumerate(tasks)]
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            yield ray.get(done[0])
    finally:
        if started:
            ray.shutdown()
