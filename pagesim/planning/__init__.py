"""Planning on top of the simulator: sweeps, capacity plans, routers, studies and figures.

grid.py, sweep.py, summary.py, backends.py   `pagesim sweep` (joblib or Ray)
slo.py, search.py, capacity.py, kv_sizing.py `pagesim plan`
router.py (+ sim/cluster.py)                 replicas behind a router
waste.py, blocksize.py, prefix.py, preemption.py   the notebooks' studies
plots.py, figures.py                         `pagesim plot` and the notebooks' figures
"""
