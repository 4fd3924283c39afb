"""`pagesim validate`: the simulator's prediction against a real GPU run of the same traffic.

Both sides draw the same requests: the plan of `(workload, num_prompts, seed)` with the
model's vocabulary and the arrival times of `(request_rate, burstiness, seed)`, exactly as
`pagesim.sim.simulate` draws them (`serve.build_traffic` is that code path; a multi-turn
workload's later turns follow the same closed loop in wall-clock time), and both use the
KV cache the GPU measured (`num_gpu_blocks_override`). The real side is a wall-clock replay
through the same scheduler (`pagesim.gpu.serve`); the predicted side is `simulate` with the
calibrated profile. Per metric the report gives the real value, the predicted value and the
error `(predicted - real) / real` in %, against the targets of `compare`.

A real run is stored as JSON (`store.save_real_run`), so the simulation half can run on any machine
later (`compare.validate_real_run`): the GPU session ships real runs, the comparison runs on a CPU.
The runs kept under `results/` are compressed with xz (`.json.xz`), a fifth smaller than gzip
on these files (per-token latencies are most of their bytes); `.json.gz` and plain `.json` are
read too.

Modules: `store` (real runs on disk, and the load stored with each), `serve` (the real side),
`compare` (prediction against real, per run and over repeats), `report` (tables and files),
`plot` (the error bars).
"""
