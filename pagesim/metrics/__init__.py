"""Run metrics shared by the simulator and the real-GPU replay: records, summaries, the
`vllm bench serve` block. Depends on numpy only, so both worlds import it."""

from pagesim.metrics.collector import STEP_COLUMNS, MetricsCollector
from pagesim.metrics.report import format_benchmark_block, summarize

__all__ = ["STEP_COLUMNS", "MetricsCollector", "format_benchmark_block", "summarize"]
