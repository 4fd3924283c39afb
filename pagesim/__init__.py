"""pagesim: a discrete-event simulator and capacity planner for LLM serving with a paged KV cache.

The KV-cache core (`pagesim.kvcache`) and the scheduler (`pagesim.scheduler`) are shared by the
SimPy simulator (`pagesim.sim`) and the real-GPU runner (`pagesim.gpu`); importing this package
imports neither SimPy nor torch.
"""

__version__ = "0.1.0"
