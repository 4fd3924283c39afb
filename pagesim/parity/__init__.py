"""Decision-level parity with vLLM's v1 KV cache manager and scheduler.

`run_parity(golden_path)` replays the workload stored in a golden decision file (recorded from
vLLM by `record_vllm`, which alone imports vLLM) through pagesim and reports the first
divergence. See docs/parity.md.
"""

from pagesim.parity.compare import Divergence, ParityReport, compare_logs
from pagesim.parity.harness import golden_files, run_parity

__all__ = ["Divergence", "ParityReport", "compare_logs", "golden_files", "run_parity"]
