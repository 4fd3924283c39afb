"""`pagesim kv-capacity`: the KV cache an engine gets, as vLLM's start-up log reports it."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from pagesim.cli import options as o
from pagesim.cli.app import app
from pagesim.config import EngineConfig
from pagesim.kvcache.sizing import kv_capacity


@app.command("kv-capacity")
def kv_capacity_command(
    model: Annotated[
        str,
        typer.Option(
            help="Model name or Hugging Face id (see `pagesim models`), or a config.json."
        ),
    ] = "llama-2-7b",
    gpu: Annotated[str, typer.Option(help="GPU name (see `pagesim models`).")] = "h200",
    block_size: Annotated[int, typer.Option(help="Tokens per KV block.")] = 16,
    max_model_len: Annotated[int | None, typer.Option(help="Default: the model's.")] = None,
    gpu_memory_utilization: Annotated[float, typer.Option()] = 0.92,
    tensor_parallel_size: Annotated[int, typer.Option()] = 1,
    kv_cache_dtype: Annotated[str, typer.Option(help="auto | fp8")] = "auto",
    num_gpu_blocks_override: Annotated[int | None, typer.Option()] = None,
    disable_hybrid_kv_cache_manager: o.DisableHybridKVCacheManager = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead.")] = False,
) -> None:
    """Print 'Available KV cache memory', 'GPU KV cache size' and 'Maximum concurrency'."""
    config = EngineConfig.create(
        model=model,
        gpu=gpu,
        block_size=block_size,
        max_model_len=max_model_len,
        gpu_memory_utilization=gpu_memory_utilization,
        kv_cache_dtype=kv_cache_dtype,
        tensor_parallel_size=tensor_parallel_size,
        num_gpu_blocks_override=num_gpu_blocks_override,
        disable_hybrid_kv_cache_manager=disable_hybrid_kv_cache_manager,
    )
    cap = kv_capacity(config)
    if as_json:
        print(json.dumps(cap.to_dict(), indent=2, default=str))
    else:
        print(cap.report())
