"""What the single-GPU timing benchmarks share: a served model's runner on the full KV cache,
the device columns every row carries, and the CSV they write.

`served_runner(name)` builds what `pagesim validate` serves with: the random-weight model in
bf16, the KV cache that vLLM's `gpu_memory_utilization` leaves (block 16), and a
`GPUModelRunner` with CUDA graphs, so that a benchmark times the runner the runs use.
`dry_runner` is its stand-in for a script's `--dry-run-cpu`: the tiny model on the CPU, whatever
model the script was asked for (the named 7B/8B models would not finish under the Triton
interpreter).
"""

from __future__ import annotations

import csv
from pathlib import Path


def served_runner(name: str, block_size: int = 16):
    """(config, runner) for model `name` on this GPU, as a served run would have them."""
    import torch

    from pagesim.config import EngineConfig
    from pagesim.gpu.memory import MemorySnapshot, measure_kv_capacity
    from pagesim.gpu.model import RandomWeightDecoder
    from pagesim.gpu.runner import GPUModelRunner

    config = EngineConfig.create(model=name, gpu="h200", block_size=block_size)
    before = MemorySnapshot.take(torch.device("cuda"))
    model = RandomWeightDecoder(config.model_spec, torch.bfloat16, "cuda", block_size, 0)
    blocks = measure_kv_capacity(config, model, before, (block_size,)).num_gpu_blocks[block_size]
    return config, GPUModelRunner(config, blocks, device="cuda", model=model)


def dry_runner(num_blocks: int, max_num_batched_tokens: int, max_model_len: int):
    """(config, runner) of the tiny model in fp32 on the CPU with `num_blocks` KV blocks of 16
    tokens (run under `TRITON_INTERPRET=1`)."""
    import torch

    from pagesim.config import EngineConfig
    from pagesim.gpu.model import RandomWeightDecoder
    from pagesim.gpu.runner import GPUModelRunner

    config = EngineConfig.create(
        model="tiny-llama",
        block_size=16,
        max_num_seqs=8,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        num_gpu_blocks_override=num_blocks,
    )
    model = RandomWeightDecoder(config.model_spec, torch.float32, "cpu", 16, 0)
    return config, GPUModelRunner(config, num_blocks, device="cpu", model=model)


def release(runner) -> None:
    """Drop a runner's model and cache before the next model is loaded."""
    import torch

    del runner.model, runner.kv_caches, runner.graphs
    torch.cuda.empty_cache()


def device_columns(info: dict) -> dict[str, str]:
    """The GPU, driver, torch, triton and date columns of a results row."""
    return {
        "gpu": info["gpu_name"],
        "driver": info.get("driver", ""),
        "torch": info["torch"],
        "triton": info["triton"],
        "date": info["date"],
    }


def write_rows(out_dir: str, name: str, rows: list[dict]) -> Path:
    """`rows` as `out_dir`/`name` (CSV, the first row's keys as the header)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / name, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return out / name
