"""Real runs on disk: the document `save_real_run` writes, the load stored with it, and the
JSON files (plain, or compressed with xz or gzip) both runs and reports are written as."""

from __future__ import annotations

import gzip
import json
import lzma
import math
from dataclasses import fields
from pathlib import Path
from typing import Any

from pagesim.config import EngineConfig
from pagesim.errors import ConfigError
from pagesim.sim.load import LoadSpec
from pagesim.workload import WORKLOAD_PARAMS  # the workload parameters a stored load may carry

REAL_RUN_FORMAT = 1
#: The endings of compressed real runs (plain `.json` ones are read too).
COMPRESSED_RUN_SUFFIXES = (".json.xz", ".json.gz")
#: Decimals of the floats in a real run's records (seconds): 1 ns, the resolution of the host
#: clock (`time.perf_counter`); the noise digits below it only make stored runs larger.
RECORD_DECIMALS = 9
#: The first bytes of every file `save_real_run` writes.
_RUN_HEAD = b'{"format":%d,' % REAL_RUN_FORMAT


def load_dict(
    workload: str,
    num_prompts: int,
    seed: int,
    request_rate: float | None,
    burstiness: float = 1.0,
    **workload_params: Any,
) -> dict[str, Any]:
    """The load of a run as stored with it (`LoadSpec`'s names; rate "inf" as a string)."""
    rate = "inf" if request_rate is not None and math.isinf(request_rate) else request_rate
    return {
        "workload": workload,
        "num_prompts": num_prompts,
        "seed": seed,
        "request_rate": rate,
        "burstiness": burstiness,
        **{k: v for k, v in workload_params.items() if v is not None},
    }


def load_spec(load: dict[str, Any]) -> LoadSpec:
    """The `LoadSpec` of a stored load (`load_dict`'s form: rate "inf" as a string): what
    `simulate` draws the run's requests from, and so what the real side draws them from too."""
    return LoadSpec(
        workload=load["workload"],
        num_prompts=load["num_prompts"],
        request_rate=math.inf if load["request_rate"] == "inf" else load["request_rate"],
        burstiness=load.get("burstiness", 1.0),
        seed=load["seed"],
        **{k: load[k] for k in WORKLOAD_PARAMS if k in load},
    )


def real_run_config(doc: dict[str, Any]) -> EngineConfig:
    """The engine config of a stored real run, over the KV cache the GPU measured."""
    cfg_fields = dict(doc["engine_config"])
    cfg_fields["num_gpu_blocks_override"] = doc["result"]["num_gpu_blocks"]
    return EngineConfig(**cfg_fields)


def save_real_run(
    path: str | Path,
    *,
    config: EngineConfig,
    load: dict[str, Any],
    result: dict[str, Any],
    records: dict[str, Any],
    device: dict[str, Any],
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write one real run: engine config (with the measured block count), load, result keys,
    raw records and the device it ran on; compressed when `path` ends in .xz or .gz."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "format": REAL_RUN_FORMAT,
        "backend": "pagesim-gpu",
        "load": load,
        "engine_config": {f.name: getattr(config, f.name) for f in fields(config)},
        "device": device,
        "result": jsonable(result),
        "records": round_floats(records, RECORD_DECIMALS),
        "extra": extra or {},
    }
    write_json_file(path, doc)
    return path


def write_json_file(path: Path, doc: Any) -> None:
    """Compact JSON, compressed when the name ends in .xz or .gz (gzip without a timestamp:
    the same document gives the same bytes)."""
    raw = (json.dumps(doc, separators=(",", ":")) + "\n").encode("utf-8")
    if path.suffix == ".xz":
        raw = lzma.compress(raw, preset=9 | lzma.PRESET_EXTREME)
    elif path.suffix == ".gz":
        raw = gzip.compress(raw, mtime=0)
    path.write_bytes(raw)


def read_json_file(path: Path) -> Any:
    """A JSON document, decompressed first when its name ends in .xz or .gz."""
    raw = path.read_bytes()
    if path.suffix == ".xz":
        raw = lzma.decompress(raw)
    elif path.suffix == ".gz":
        raw = gzip.decompress(raw)
    return json.loads(raw.decode("utf-8"))


def real_run_files(folder: str | Path) -> list[Path]:
    """The stored real runs in `folder`, sorted by name: compressed runs by their suffix,
    plain JSON files only if they open as `save_real_run` writes them (a GPU call's folder
    also holds its `summary.json` and `graph_vs_eager.json`)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(
        p
        for p in folder.iterdir()
        if p.is_file()
        and (
            p.name.endswith(COMPRESSED_RUN_SUFFIXES)
            or (p.name.endswith(".json") and _opens_as_run(p))
        )
    )


def _opens_as_run(path: Path) -> bool:
    """Whether a plain JSON file begins as `save_real_run` begins every run."""
    with open(path, "rb") as fh:
        return fh.read(len(_RUN_HEAD)) == _RUN_HEAD


def read_real_run(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"real run {str(p)!r}: no such file")
    try:
        doc = read_json_file(p)
    except (json.JSONDecodeError, UnicodeDecodeError, OSError, EOFError, lzma.LZMAError) as e:
        raise ConfigError(f"real run {str(p)!r}: not valid JSON ({e})") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"real run {str(p)!r}: expected a JSON object, not {type(doc).__name__}")
    if doc.get("format") != REAL_RUN_FORMAT:
        raise ConfigError(
            f"real run {str(p)!r}: format={doc.get('format')!r} is not {REAL_RUN_FORMAT}"
        )
    return doc


def round_floats(value: Any, decimals: int) -> Any:
    """`value` with every float inside its dicts and lists rounded to `decimals`."""
    if isinstance(value, float):
        return round(value, decimals)
    if isinstance(value, list):
        if value and all(type(v) is float for v in value):  # the common column: one pass
            return [round(v, decimals) for v in value]
        return [round_floats(v, decimals) for v in value]
    if isinstance(value, dict):
        return {k: round_floats(v, decimals) for k, v in value.items()}
    return value


def jsonable(d: dict[str, Any]) -> dict[str, Any]:
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in d.items()}
