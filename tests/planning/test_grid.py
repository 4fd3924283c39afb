"""Sweep grids: typed comma lists, parameter files, products, names, one-line errors."""

from __future__ import annotations

import json
import math

import pytest

from pagesim.errors import ConfigError
from pagesim.planning.grid import build_grid, parse_axis, read_param_file
from pagesim.planning.mix import mix_spec, parse_mix


def test_axes_are_typed() -> None:
    assert parse_axis("block_size", "8,16,32") == [8, 16, 32]
    assert parse_axis("request_rate", "2,inf") == [2.0, math.inf]
    assert parse_axis("enable_prefix_caching", "true,off") == [True, False]
    assert parse_axis("max_concurrency", "none,8") == [None, 8]
    assert parse_axis("workload", "chat,chat:0.7+code:0.3") == ["chat", "chat:0.7+code:0.3"]


@pytest.mark.parametrize(
    "key, text, words",
    [
        ("block_size", "8,x", "expected an integer"),
        ("block_size", "8,,16", "empty item"),
        ("request_rate", "fast", "expected a number"),
        ("enable_prefix_caching", "maybe", "true or false"),
        ("block_size", "none", "a value is required"),
        ("blok_size", "8", "unknown setting"),
    ],
)
def test_bad_axes(key: str, text: str, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        parse_axis(key, text)


def test_product_order_and_names() -> None:
    grid = build_grid(
        {"block_size": [8, 16], "request_rate": [2.0, math.inf]}, base={"num_prompts": 10}
    )
    assert [p.name for p in grid.points] == [
        "ENGINE-block_size=8-LOAD-request_rate=2",
        "ENGINE-block_size=8-LOAD-request_rate=inf",
        "ENGINE-block_size=16-LOAD-request_rate=2",
        "ENGINE-block_size=16-LOAD-request_rate=inf",
    ]
    assert grid.varying == ("block_size", "request_rate")
    assert grid.points[3].settings == {
        "num_prompts": 10,
        "block_size": 16,
        "request_rate": math.inf,
    }
    assert grid.points[3].engine_config().block_size == 16
    assert grid.points[3].load_spec().request_rate == math.inf


def test_single_point_is_named_default() -> None:
    grid = build_grid({"block_size": [16]})
    assert [p.name for p in grid.points] == ["default"]


def test_param_files_multiply_with_axes(tmp_path) -> None:
    serve = tmp_path / "serve.json"
    serve.write_text(
        json.dumps(
            [
                {"max_num_seqs": 32, "max_num_batched_tokens": 1024},
                {"max-num-seqs": 64, "max_num_batched_tokens": 2048},
            ]
        )
    )
    bench = tmp_path / "bench.yaml"
    bench.write_text("- {request_rate: 2}\n- {request_rate: 4, workload: code}\n")
    grid = build_grid(
        {"block_size": [8, 16]},
        engine_params=read_param_file(serve, "engine"),
        load_params=read_param_file(bench, "load"),
    )
    assert len(grid) == 8
    first = grid.points[0].settings
    assert first == {
        "max_num_seqs": 32,
        "max_num_batched_tokens": 1024,
        "block_size": 8,
        "request_rate": 2.0,
    }
    assert grid.points[-1].settings["workload"] == "code"
    assert "max_num_seqs" in grid.varying and "workload" in grid.varying


def test_param_file_errors(tmp_path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="malformed JSON"):
        read_param_file(bad, "engine")
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps([{"request_rate": 2}]))
    with pytest.raises(ConfigError, match="not a engine setting"):
        read_param_file(wrong, "engine")
    with pytest.raises(ConfigError, match="cannot read"):
        read_param_file(tmp_path / "missing.json", "load")
    both = tmp_path / "both.json"
    both.write_text(json.dumps([{"block_size": 8}]))
    with pytest.raises(ConfigError, match="both as a flag and in --engine-params"):
        build_grid({"block_size": [16]}, engine_params=read_param_file(both, "engine"))


def test_invalid_point_names_itself() -> None:
    with pytest.raises(ConfigError, match=r"sweep point .*block_size=0.*: block_size=0"):
        build_grid({"block_size": [16, 0]})
    with pytest.raises(ConfigError, match="workload 'nope'"):
        build_grid({"workload": ["chat", "chat:1+nope:1"]})
    # sized as `pagesim run` sizes it: llama-2-70b's weights do not fit one H200 at 0.92
    with pytest.raises(ConfigError, match="point ENGINE-model=llama-2-70b: weights of llama-2-70b"):
        build_grid({"model": ["llama-2-7b", "llama-2-70b"]})


def test_mix_text() -> None:
    assert parse_mix("chat:0.7+code:0.3") == [("chat", 0.7), ("code", 0.3)]
    assert parse_mix("chat+code") == [("chat", 1.0), ("code", 1.0)]
    assert mix_spec("chat:0.7+code:0.3") == {
        "name": "mix-chat0.7-code0.3",
        "mix": [{"workload": "chat", "weight": 0.7}, {"workload": "code", "weight": 0.3}],
    }
    with pytest.raises(ConfigError, match="must be > 0"):
        parse_mix("chat:0")
    with pytest.raises(ConfigError, match="'chat:0.7\\+code': no weight for 'code'"):
        parse_mix("chat:0.7+code")  # not code weight 1, 59 % of the requests
