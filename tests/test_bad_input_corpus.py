"""A corpus of bad inputs across every command: each must give exactly one line on stderr,
exit code 2, no traceback, within 10 s. Run in process through `pagesim.cli.app.main`.

Each case is (id, argv, files): `files` maps a path under the test's folder to its text or
bytes; `PROFILE/...` paths are written over a copy of the shipped llama-2-7b H200 profile at
`prof/`, and `SWEEP/...` over a small finished sweep at `sw/`.
"""

from __future__ import annotations

import contextlib
import io
import shutil
import signal
import time
from pathlib import Path

import pytest

from pagesim.cli.app import main
from pagesim.data import calibration_dir

RUN = ["run", "--quiet", "--num-prompts", "20"]
PLAN = ["plan", "--slo", "p99_ttft_ms<=500", "--num-prompts", "20"]
SWEEP = ["sweep", "--quiet", "--num-prompts", "5"]
KVC = ["kv-capacity"]

SPEC_HEAD = "name: x\n"
REAL_RUN_KEYS = '{"format": "pagesim-real-run"}'


def spec(body: str) -> dict[str, str]:
    return {"w.yaml": SPEC_HEAD + body}


CASES: list[tuple[str, list[str], dict[str, str | bytes]]] = [
    # ---- run: absurd numbers on flags ----
    ("swap-space-inf", [*RUN, "--swap-space", "inf"], {}),
    ("swap-space-nan", [*RUN, "--swap-space", "nan"], {}),
    ("swap-space-neg", [*RUN, "--swap-space", "-1"], {}),
    ("swap-space-huge", [*RUN, "--swap-space", "1e30"], {}),
    ("num-prompts-1e11", ["run", "--quiet", "--num-prompts", "100000000000"], {}),
    ("num-prompts-neg", ["run", "--quiet", "--num-prompts", "-3"], {}),
    ("request-rate-nan", [*RUN, "--request-rate", "nan"], {}),
    ("request-rate-neg-inf", [*RUN, "--request-rate", "-inf"], {}),
    ("request-rate-span", [*RUN, "--request-rate", "1e-9"], {}),  # 20 over 2e10 s
    ("request-rate-denormal", [*RUN, "--request-rate", "5e-324"], {}),
    ("burstiness-nan", [*RUN, "--burstiness", "nan"], {}),
    ("burstiness-inf", [*RUN, "--burstiness", "inf"], {}),
    ("burstiness-tiny", [*RUN, "--burstiness", "1e-300"], {}),
    ("block-size-2e40", [*RUN, "--block-size", "1099511627776"], {}),
    ("block-size-neg", [*RUN, "--block-size", "-16"], {}),
    ("num-blocks-2e40", [*RUN, "--num-gpu-blocks-override", "1099511627776"], {}),
    ("num-blocks-neg", [*RUN, "--num-gpu-blocks-override", "-5"], {}),
    ("gpu-mem-util-nan", [*RUN, "--gpu-memory-utilization", "nan"], {}),
    ("gpu-mem-util-2", [*RUN, "--gpu-memory-utilization", "2"], {}),
    ("gpu-mem-util-0", [*RUN, "--gpu-memory-utilization", "0"], {}),
    ("gpu-mem-util-inf", [*RUN, "--gpu-memory-utilization", "inf"], {}),
    ("max-num-seqs-0", [*RUN, "--max-num-seqs", "0"], {}),
    ("max-num-seqs-huge", [*RUN, "--max-num-seqs", "1099511627776"], {}),
    ("max-batched-0", [*RUN, "--max-num-batched-tokens", "0"], {}),
    ("max-batched-huge", [*RUN, "--max-num-batched-tokens", "1099511627776"], {}),
    (
        "max-batched-below-seqs",
        [*RUN, "--max-num-batched-tokens", "64", "--max-num-seqs", "256"],
        {},
    ),
    ("max-model-len-0", [*RUN, "--max-model-len", "0"], {}),
    ("max-model-len-neg", [*RUN, "--max-model-len", "-1"], {}),
    ("long-prefill-over-max-len", [*RUN, "--long-prefill-token-threshold", "100000"], {}),
    ("long-prefill-neg", [*RUN, "--long-prefill-token-threshold", "-1"], {}),
    ("tp-0", [*RUN, "--tensor-parallel-size", "0"], {}),
    ("tp-3-heads", [*RUN, "--tensor-parallel-size", "3"], {}),
    ("tp-huge", [*RUN, "--tensor-parallel-size", "1099511627776"], {}),
    ("kv-dtype-bogus", [*RUN, "--kv-cache-dtype", "int3"], {}),
    ("policy-bogus", [*RUN, "--scheduling-policy", "lifo"], {}),
    ("vllm-compat-bogus", [*RUN, "--vllm-compat", "0.1"], {}),
    ("placement-bogus", [*RUN, "--allocator", "pow2", "--contiguous-placement", "best"], {}),
    ("placement-with-paged", [*RUN, "--allocator", "paged", "--contiguous-placement", "buddy"], {}),
    ("step-time-scale-0", [*RUN, "--step-time-scale", "0"], {}),
    ("step-time-scale-nan", [*RUN, "--step-time-scale", "nan"], {}),
    ("step-time-scale-inf", [*RUN, "--step-time-scale", "inf"], {}),
    ("max-concurrency-neg", [*RUN, "--max-concurrency", "-2"], {}),
    ("seed-neg", [*RUN, "--seed", "-1"], {}),
    (
        "random-input-len-1e9",
        [*RUN, "--workload", "random", "--random-input-len", "3000000000"],
        {},
    ),
    (
        "random-output-len-1e9",
        [*RUN, "--workload", "random", "--random-output-len", "3000000000"],
        {},
    ),
    ("random-input-len-0", [*RUN, "--workload", "random", "--random-input-len", "0"], {}),
    ("random-output-len-neg", [*RUN, "--workload", "random", "--random-output-len", "-4"], {}),
    (
        "random-prefix-len-huge",
        [*RUN, "--workload", "random", "--random-prefix-len", "3000000000"],
        {},
    ),
    ("random-range-ratio-nan", [*RUN, "--workload", "random", "--random-range-ratio", "nan"], {}),
    ("random-range-ratio-neg", [*RUN, "--workload", "random", "--random-range-ratio", "-0.5"], {}),
    ("goodput-nan", [*RUN, "--goodput", "ttft:nan"], {}),
    ("goodput-neg", [*RUN, "--goodput", "tpot:-5"], {}),
    ("goodput-inf", [*RUN, "--goodput", "e2el:inf"], {}),
    ("goodput-zero", [*RUN, "--goodput", "ttft:0"], {}),
    ("goodput-empty", [*RUN, "--goodput", "ttft:"], {}),
    ("percentile-nan", [*RUN, "--metric-percentiles", "nan"], {}),
    ("percentile-neg", [*RUN, "--metric-percentiles", "-1"], {}),
    ("percentile-0", [*RUN, "--metric-percentiles", "0"], {}),
    ("block-size-text", [*RUN, "--block-size", "sixteen"], {}),
    ("num-prompts-float", [*RUN, "--num-prompts", "2.5"], {}),
    # a missing folder is made, as --result-dir's is; a file in its place is refused
    ("result-filename-slash", [*RUN, "--save-result", "--result-filename", "a/b.json"], {"a": "x"}),
    ("result-filename-long", [*RUN, "--save-result", "--result-filename", "x" * 300 + ".json"], {}),
    (
        "result-filename-exists",
        [*RUN, "--save-result", "--result-filename", "taken.json"],
        {"taken.json": "{}"},
    ),
    # ---- run: --config values ----
    ("config-swap-inf", [*RUN, "--config", "c.yaml"], {"c.yaml": "swap_space: .inf\n"}),
    ("config-rate-nan", [*RUN, "--config", "c.yaml"], {"c.yaml": "request_rate: .nan\n"}),
    (
        "config-blocks-huge",
        [*RUN, "--config", "c.yaml"],
        {"c.yaml": "num_gpu_blocks_override: 1099511627776\n"},
    ),
    (
        "config-prompts-huge",
        ["run", "--quiet", "--config", "c.yaml"],
        {"c.yaml": "num_prompts: 1.0e11\n"},
    ),
    ("config-block-size-list", [*RUN, "--config", "c.yaml"], {"c.yaml": "block_size: [16]\n"}),
    ("config-bool-int", [*RUN, "--config", "c.yaml"], {"c.yaml": "enable_prefix_caching: 1\n"}),
    ("config-model-list", [*RUN, "--config", "c.yaml"], {"c.yaml": "model: [a, b]\n"}),
    ("config-goodput-nan", [*RUN, "--config", "c.yaml"], {"c.yaml": "goodput: {ttft: .nan}\n"}),
    (
        "config-percentiles-map",
        [*RUN, "--config", "c.yaml"],
        {"c.yaml": "metric_percentiles: {a: 1}\n"},
    ),
    ("config-empty-key", [*RUN, "--config", "c.yaml"], {"c.yaml": "? ''\n: 1\n"}),
    ("config-scalar", [*RUN, "--config", "c.yaml"], {"c.yaml": "42\n"}),
    ("config-binary", [*RUN, "--config", "c.yaml"], {"c.yaml": b"\xff\xfe\x00\x01binary"}),
    ("config-tabs", [*RUN, "--config", "c.yaml"], {"c.yaml": "block_size:\t16\n\t- x\n"}),
    (
        "config-long-prefill",
        [*RUN, "--config", "c.yaml"],
        {"c.yaml": "long_prefill_token_threshold: 99999\n"},
    ),
    (
        "config-seqs-over-batch",
        [*RUN, "--config", "c.yaml"],
        {"c.yaml": "max_num_seqs: 512\nmax_num_batched_tokens: 128\n"},
    ),
    # ---- workload specs ----
    (
        "spec-len-1e30",
        [*RUN, "--workload", "w.yaml"],
        spec(
            "lengths:\n  input: {dist: constant, value: 1.0e30}\n  output: {dist: constant, value: 10}\n"
        ),
    ),
    (
        "spec-uniform-high-1e20",
        [*RUN, "--workload", "w.yaml"],
        spec(
            "lengths:\n  input: {dist: uniform, low: 1, high: 1.0e20}\n  output: {dist: constant, value: 10}\n"
        ),
    ),
    (
        "spec-uniform-nan",
        [*RUN, "--workload", "w.yaml"],
        spec(
            "lengths:\n  input: {dist: uniform, low: .nan, high: 10}\n  output: {dist: constant, value: 10}\n"
        ),
    ),
    (
        "spec-lognormal-inf",
        [*RUN, "--workload", "w.yaml"],
        spec(
            "lengths:\n  input: {dist: lognormal, mean: .inf, std: 1}\n  output: {dist: constant, value: 10}\n"
        ),
    ),
    (
        "spec-lognormal-neg-std",
        [*RUN, "--workload", "w.yaml"],
        spec(
            "lengths:\n  input: {dist: lognormal, mean: 100, std: -1}\n  output: {dist: constant, value: 10}\n"
        ),
    ),
    (
        "spec-max-huge",
        [*RUN, "--workload", "w.yaml"],
        spec(
            "lengths:\n  input: {dist: lognormal, mean: 100, std: 10, max: 1.0e30}\n  output: {dist: constant, value: 10}\n"
        ),
    ),
    (
        "spec-dist-string",
        [*RUN, "--workload", "w.yaml"],
        spec("lengths:\n  input: lots\n  output: {dist: constant, value: 10}\n"),
    ),
    (
        "spec-dist-unknown",
        [*RUN, "--workload", "w.yaml"],
        spec("lengths:\n  input: {dist: pareto, a: 1}\n  output: {dist: constant, value: 10}\n"),
    ),
    (
        "spec-prefix-groups-1e10",
        [*RUN, "--workload", "w.yaml"],
        spec(
            "lengths: {random: {input_len: 100, output_len: 10}}\nprefix: {groups: 10000000000, length: 10}\n"
        ),
    ),
    (
        "spec-prefix-len-1e30",
        [*RUN, "--workload", "w.yaml"],
        spec(
            "lengths: {random: {input_len: 100, output_len: 10}}\nprefix: {groups: 1, length: 1.0e30}\n"
        ),
    ),
    (
        "spec-prefix-zipf-nan",
        [*RUN, "--workload", "w.yaml"],
        spec(
            "lengths: {random: {input_len: 100, output_len: 10}}\nprefix: {groups: 2, length: 10, zipf: .nan}\n"
        ),
    ),
    (
        "spec-tenants-1e10",
        [*RUN, "--workload", "w.yaml"],
        spec(
            "lengths: {random: {input_len: 100, output_len: 10}}\ntenants: {count: 10000000000}\n"
        ),
    ),
    (
        "spec-tenants-neg",
        [*RUN, "--workload", "w.yaml"],
        spec("lengths: {random: {input_len: 100, output_len: 10}}\ntenants: {count: -1}\n"),
    ),
    (
        "spec-tenants-zipf-inf",
        [*RUN, "--workload", "w.yaml"],
        spec(
            "lengths: {random: {input_len: 100, output_len: 10}}\ntenants: {count: 3, zipf: .inf}\n"
        ),
    ),
    (
        "spec-turns-1e19",
        [*RUN, "--workload", "w.yaml"],
        spec(
            "lengths: {random: {input_len: 100, output_len: 10}}\nsessions: {turns: {dist: constant, value: 1.0e19}}\n"
        ),
    ),
    (
        "spec-think-nan",
        [*RUN, "--workload", "w.yaml"],
        spec(
            "lengths: {random: {input_len: 100, output_len: 10}}\nsessions: {turns: {dist: constant, value: 2}, think_time_s: {dist: constant, value: .nan}}\n"
        ),
    ),
    (
        "spec-max-context-huge",
        [*RUN, "--workload", "w.yaml"],
        spec(
            "lengths: {random: {input_len: 100, output_len: 10}}\nsessions: {turns: {dist: constant, value: 2}, max_context_tokens: 1.0e30}\n"
        ),
    ),
    (
        "spec-arrival-rate-nan",
        [*RUN, "--workload", "w.yaml"],
        spec(
            "lengths: {random: {input_len: 100, output_len: 10}}\narrival: {process: poisson, rate: .nan}\n"
        ),
    ),
    (
        "spec-arrival-rate-neg",
        [*RUN, "--workload", "w.yaml"],
        spec(
            "lengths: {random: {input_len: 100, output_len: 10}}\narrival: {process: poisson, rate: -1.0}\n"
        ),
    ),
    (
        "spec-arrival-burst-inf",
        [*RUN, "--workload", "w.yaml"],
        spec(
            "lengths: {random: {input_len: 100, output_len: 10}}\narrival: {process: gamma, rate: 1, burstiness: .inf}\n"
        ),
    ),
    (
        "spec-time-scale-0",
        [*RUN, "--workload", "w.yaml"],
        spec(
            "lengths: {random: {input_len: 100, output_len: 10}}\narrival: {process: inf, time_scale: 0}\n"
        ),
    ),
    (
        "spec-random-len-1e30",
        [*RUN, "--workload", "w.yaml"],
        spec("lengths: {random: {input_len: 1.0e30, output_len: 10}}\n"),
    ),
    (
        "spec-random-len-string",
        [*RUN, "--workload", "w.yaml"],
        spec("lengths: {random: {input_len: many, output_len: 10}}\n"),
    ),
    (
        "spec-random-len-bool",
        [*RUN, "--workload", "w.yaml"],
        spec("lengths: {random: {input_len: true, output_len: 10}}\n"),
    ),
    (
        "spec-mix-weight-nan",
        [*RUN, "--workload", "w.yaml"],
        spec("mix:\n  - {workload: chat, weight: .nan}\n"),
    ),
    (
        "spec-mix-weight-neg",
        [*RUN, "--workload", "w.yaml"],
        spec("mix:\n  - {workload: chat, weight: -1}\n"),
    ),
    (
        "spec-mix-self",
        [*RUN, "--workload", "w.yaml"],
        spec("mix:\n  - {workload: w.yaml, weight: 1}\n"),
    ),
    ("spec-mix-empty", [*RUN, "--workload", "w.yaml"], spec("mix: []\n")),
    ("spec-no-source", [*RUN, "--workload", "w.yaml"], spec("description: nothing\n")),
    ("spec-list", [*RUN, "--workload", "w.yaml"], {"w.yaml": "- 1\n- 2\n"}),
    ("spec-binary", [*RUN, "--workload", "w.yaml"], {"w.yaml": b"\x00\xff\xfe\x01"}),
    ("spec-empty", [*RUN, "--workload", "w.yaml"], {"w.yaml": ""}),
    ("spec-trace-missing", [*RUN, "--workload", "w.yaml"], spec("trace: nowhere.csv\n")),
    ("mix-arg-bad-weight", [*RUN, "--workload", "chat:abc+code:0.5"], {}),
    ("mix-arg-nan-weight", [*RUN, "--workload", "chat:nan+code:0.5"], {}),
    # ---- traces ----
    (
        "jsonl-hash-ids-2e64",
        [*RUN, "--workload", "t.jsonl"],
        {
            "t.jsonl": '{"timestamp": 0, "input_length": 1024, "output_length": 10, "hash_ids": [100000000000000000000000]}\n'
        },
    ),
    (
        "jsonl-len-2e64",
        [*RUN, "--workload", "t.jsonl"],
        {
            "t.jsonl": '{"timestamp": 0, "input_length": 100000000000000000000000, "output_length": 10, "hash_ids": [1]}\n'
        },
    ),
    (
        "jsonl-len-float",
        [*RUN, "--workload", "t.jsonl"],
        {
            "t.jsonl": '{"timestamp": 0, "input_length": 1.0e30, "output_length": 10, "hash_ids": [1]}\n'
        },
    ),
    (
        "jsonl-ts-nan",
        [*RUN, "--workload", "t.jsonl"],
        {
            "t.jsonl": '{"timestamp": NaN, "input_length": 100, "output_length": 10, "hash_ids": [1]}\n'
        },
    ),
    (
        "jsonl-hash-ids-neg",
        [*RUN, "--workload", "t.jsonl"],
        {
            "t.jsonl": '{"timestamp": 0, "input_length": 100, "output_length": 10, "hash_ids": [-5]}\n'
        },
    ),
    (
        "jsonl-hash-ids-str",
        [*RUN, "--workload", "t.jsonl"],
        {
            "t.jsonl": '{"timestamp": 0, "input_length": 100, "output_length": 10, "hash_ids": ["a"]}\n'
        },
    ),
    ("jsonl-not-object", [*RUN, "--workload", "t.jsonl"], {"t.jsonl": "[1, 2, 3]\n"}),
    (
        "jsonl-truncated",
        [*RUN, "--workload", "t.jsonl"],
        {"t.jsonl": '{"timestamp": 0, "input_len'},
    ),
    ("jsonl-empty", [*RUN, "--workload", "t.jsonl"], {"t.jsonl": ""}),
    ("jsonl-binary", [*RUN, "--workload", "t.jsonl"], {"t.jsonl": b"\xff\xfe\x00garbage\n"}),
    (
        "csv-sci-notation",
        [*RUN, "--workload", "t.csv"],
        {"t.csv": "timestamp,input_length,output_length\n0,1e3,10\n1,100,10\n"},
    ),
    (
        "csv-huge-len",
        [*RUN, "--workload", "t.csv"],
        {"t.csv": "timestamp,input_length,output_length\n0,100000000000000000000,10\n"},
    ),
    (
        "csv-float-len",
        [*RUN, "--workload", "t.csv"],
        {"t.csv": "timestamp,input_length,output_length\n0,10.5,10\n"},
    ),
    (
        "csv-text-len",
        [*RUN, "--workload", "t.csv"],
        {"t.csv": "timestamp,input_length,output_length\n0,abc,10\n"},
    ),
    (
        "csv-nan-ts",
        [*RUN, "--workload", "t.csv"],
        {"t.csv": "timestamp,input_length,output_length\nnan,10,10\n"},
    ),
    ("csv-empty", [*RUN, "--workload", "t.csv"], {"t.csv": ""}),
    (
        "csv-header-only",
        [*RUN, "--workload", "t.csv"],
        {"t.csv": "timestamp,input_length,output_length\n"},
    ),
    ("csv-binary", [*RUN, "--workload", "t.csv"], {"t.csv": b"\x00\x01\xff\xfe,\x00\n\x80\x81"}),
    (
        "csv-zero-output",
        [*RUN, "--workload", "t.csv"],
        {"t.csv": "timestamp,input_length,output_length\n0,10,0\n"},
    ),
    # ---- calibration profiles ----
    ("profile-missing-dir", [*RUN, "--profile", "nowhere"], {}),
    ("profile-device-text", [*RUN, "--profile", "prof"], {"PROFILE/profile.json": "DEVICE_TEXT"}),
    (
        "profile-json-binary",
        [*RUN, "--profile", "prof"],
        {"PROFILE/profile.json": b"\xff\xfe\x00\x00"},
    ),
    ("profile-json-list", [*RUN, "--profile", "prof"], {"PROFILE/profile.json": "[]"}),
    ("profile-json-null", [*RUN, "--profile", "prof"], {"PROFILE/profile.json": "null"}),
    (
        "profile-json-truncated",
        [*RUN, "--profile", "prof"],
        {"PROFILE/profile.json": '{"model": "llama'},
    ),
    (
        "profile-csv-binary",
        [*RUN, "--profile", "prof"],
        {"PROFILE/decode.csv": b"\x80\x81\x82\xff\xfe\n\x00\x00"},
    ),
    ("profile-csv-zero-times", [*RUN, "--profile", "prof"], {"PROFILE/decode.csv": "ZERO_DECODE"}),
    ("profile-csv-empty", [*RUN, "--profile", "prof"], {"PROFILE/decode.csv": ""}),
    ("profile-csv-nan", [*RUN, "--profile", "prof"], {"PROFILE/decode.csv": "NAN_DECODE"}),
    ("profile-csv-neg", [*RUN, "--profile", "prof"], {"PROFILE/decode.csv": "NEG_DECODE"}),
    ("profile-csv-text", [*RUN, "--profile", "prof"], {"PROFILE/decode.csv": "TEXT_DECODE"}),
    (
        "profile-csv-one-row",
        [*RUN, "--profile", "prof"],
        {"PROFILE/decode.csv": "ONE_ROW_DECODE"},
    ),
    (
        "profile-prefill-empty",
        [*RUN, "--profile", "prof"],
        {"PROFILE/prefill.csv": "block_size,num_new_tokens\n"},
    ),
    (
        "profile-overhead-binary",
        [*RUN, "--profile", "prof"],
        {"PROFILE/overhead.csv": b"\xff\x00\xfe"},
    ),
    ("fit-report-bad-profile", ["fit-report", "--profile", "prof"], {"PROFILE/profile.json": "[]"}),
    ("fit-report-holdout-2", ["fit-report", "--holdout-fraction", "2"], {}),
    ("fit-report-holdout-nan", ["fit-report", "--holdout-fraction", "nan"], {}),
    (
        "merge-onto-existing",
        ["merge-profiles", "prof", "prof2", "-o", "taken"],
        {"PROFILE/decode.csv": None, "taken/profile.json": "{}"},
    ),
    ("merge-onto-file", ["merge-profiles", "prof", "prof2", "-o", "afile"], {"afile": "x"}),
    (
        "merge-bad-source",
        ["merge-profiles", "prof", "nowhere", "-o", "out"],
        {"PROFILE/decode.csv": None},
    ),
    (
        "merge-corrupt-source",
        ["merge-profiles", "prof", "bad", "-o", "out"],
        {"PROFILE/decode.csv": None, "bad/profile.json": "{"},
    ),
    ("merge-same-source", ["merge-profiles", "prof", "-o", "prof"], {"PROFILE/decode.csv": None}),
    # ---- kv-capacity ----
    ("kvc-tp-3", [*KVC, "--tensor-parallel-size", "3"], {}),
    ("kvc-tp-0", [*KVC, "--tensor-parallel-size", "0"], {}),
    ("kvc-block-huge", [*KVC, "--block-size", "1099511627776"], {}),
    ("kvc-util-nan", [*KVC, "--gpu-memory-utilization", "nan"], {}),
    ("kvc-blocks-huge", [*KVC, "--num-gpu-blocks-override", "1099511627776"], {}),
    ("kvc-model-bogus", [*KVC, "--model", "gpt-9"], {}),
    ("kvc-dtype-bogus", [*KVC, "--kv-cache-dtype", "int2"], {}),
    ("kvc-max-len-neg", [*KVC, "--max-model-len", "-5"], {}),
    # ---- plan ----
    ("plan-min-duration-nan", [*PLAN, "--min-duration", "nan"], {}),
    ("plan-min-duration-inf", [*PLAN, "--min-duration", "inf"], {}),
    ("plan-min-duration-neg", [*PLAN, "--min-duration", "-1"], {}),
    ("plan-rel-tol-0", [*PLAN, "--rel-tol", "0"], {}),
    ("plan-rel-tol-nan", [*PLAN, "--rel-tol", "nan"], {}),
    ("plan-slo-nan", ["plan", "--slo", "p99_ttft_ms<=nan", "--num-prompts", "20"], {}),
    ("plan-slo-neg", ["plan", "--slo", "p99_ttft_ms<=-3", "--num-prompts", "20"], {}),
    ("plan-slo-garbage", ["plan", "--slo", "fast please", "--num-prompts", "20"], {}),
    ("plan-attain-2", [*PLAN, "--slo-attainment", "2"], {}),
    ("plan-attain-nan", [*PLAN, "--slo-attainment", "nan"], {}),
    ("plan-target-rate-nan", [*PLAN, "--target-rate", "nan"], {}),
    ("plan-target-rate-neg", [*PLAN, "--target-rate", "-1"], {}),
    ("plan-max-replicas-0", [*PLAN, "--target-rate", "5", "--max-replicas", "0"], {}),
    (
        "plan-max-replicas-huge",
        [*PLAN, "--target-rate", "5", "--max-replicas", "1099511627776"],
        {},
    ),
    ("plan-save-unwritable", [*PLAN, "--save-result", "afile/x.json"], {"afile": "x"}),
    ("plan-save-dir", [*PLAN, "--save-result", "adir"], {"adir/keep": "x"}),
    (
        "plan-num-prompts-huge",
        ["plan", "--slo", "p99_ttft_ms<=500", "--num-prompts", "100000000000"],
        {},
    ),
    ("plan-router-bogus", [*PLAN, "--target-rate", "5", "--router", "psychic"], {}),
    ("plan-step-scale-nan", [*PLAN, "--step-time-scale", "nan"], {}),
    ("plan-swap-inf", [*PLAN, "--swap-space", "inf"], {}),
    # ---- sweep ----
    ("sweep-jobs-0", [*SWEEP, "--jobs", "0", "--block-size", "16"], {}),
    ("sweep-jobs-neg", [*SWEEP, "--jobs", "-2", "--block-size", "16"], {}),
    ("sweep-num-runs-0", [*SWEEP, "--num-runs", "0", "--block-size", "16"], {}),
    (
        "sweep-grid-absurd",
        [
            *SWEEP,
            "--block-size",
            ",".join(str(16) for _ in range(1)),
            "--seed",
            ",".join(str(i) for i in range(2000)),
            "--request-rate",
            ",".join(str(i + 1) for i in range(2000)),
        ],
        {},
    ),
    ("sweep-num-runs-huge", [*SWEEP, "--num-runs", "100000000000", "--block-size", "16"], {}),
    ("sweep-output-long-name", [*SWEEP, "--block-size", "16", "--output-dir", "o" * 300], {}),
    ("sweep-output-file", [*SWEEP, "--block-size", "16", "--output-dir", "afile"], {"afile": "x"}),
    ("sweep-bad-value", [*SWEEP, "--block-size", "16,abc"], {}),
    ("sweep-nan-rate", [*SWEEP, "--request-rate", "nan"], {}),
    ("sweep-inf-swap", [*SWEEP, "--swap-space", "inf"], {}),
    ("sweep-huge-blocks", [*SWEEP, "--num-gpu-blocks-override", "1099511627776"], {}),
    ("sweep-empty-list", [*SWEEP, "--block-size", ","], {}),
    ("sweep-engine-params-garbage", [*SWEEP, "--engine-params", "e.json"], {"e.json": "{not json"}),
    (
        "sweep-engine-params-unknown",
        [*SWEEP, "--engine-params", "e.json"],
        {"e.json": '[{"bogus": 1}]'},
    ),
    (
        "sweep-engine-params-nan",
        [*SWEEP, "--engine-params", "e.json"],
        {"e.json": '[{"swap_space": NaN}]'},
    ),
    ("sweep-load-params-binary", [*SWEEP, "--load-params", "l.json"], {"l.json": b"\xff\xfe\x00"}),
    ("sweep-resume-missing", [*SWEEP, "--resume", "nowhere"], {}),
    ("sweep-resume-corrupt-json", [*SWEEP, "--resume", "sw"], {"SWEEP/sweep.json": "{trunc"}),
    ("sweep-resume-json-list", [*SWEEP, "--resume", "sw"], {"SWEEP/sweep.json": "[]"}),
    ("sweep-resume-json-null", [*SWEEP, "--resume", "sw"], {"SWEEP/sweep.json": "null"}),
    ("sweep-resume-json-nokeys", [*SWEEP, "--resume", "sw"], {"SWEEP/sweep.json": '{"x": 1}'}),
    ("sweep-resume-json-binary", [*SWEEP, "--resume", "sw"], {"SWEEP/sweep.json": b"\x00\xff"}),
    (
        "sweep-resume-run-truncated",
        [*SWEEP, "--resume", "sw"],
        {"SWEEP/sweep.json": None, "SWEEP/default/run=0.json": '{"date": "2026'},
    ),
    (
        "sweep-resume-json-bad-grid",
        [*SWEEP, "--resume", "sw"],
        {"SWEEP/sweep.json": '{"engine": 5, "load": "x"}'},
    ),
    ("sweep-resume-a-file", [*SWEEP, "--resume", "afile"], {"afile": "x"}),
    # ---- validate --real ----
    (
        "validate-real-list",
        ["validate", "--real", "r.json", "--output-dir", "out"],
        {"r.json": "[]"},
    ),
    (
        "validate-real-null",
        ["validate", "--real", "r.json", "--output-dir", "out"],
        {"r.json": "null"},
    ),
    (
        "validate-real-marker-only",
        ["validate", "--real", "r.json", "--output-dir", "out"],
        {"r.json": REAL_RUN_KEYS},
    ),
    (
        "validate-real-empty",
        ["validate", "--real", "r.json", "--output-dir", "out"],
        {"r.json": ""},
    ),
    (
        "validate-real-binary",
        ["validate", "--real", "r.json", "--output-dir", "out"],
        {"r.json": b"\xff\xfe\x00"},
    ),
    (
        "validate-real-truncated",
        ["validate", "--real", "r.json", "--output-dir", "out"],
        {"r.json": '{"format": "pagesim'},
    ),
    (
        "validate-real-unknown-engine",
        ["validate", "--real", "r.json", "--output-dir", "out"],
        {"r.json": '{"engine": {"bogus_key": 1}, "load": {}, "result": {}}'},
    ),
    ("validate-real-missing", ["validate", "--real", "nowhere.json", "--output-dir", "out"], {}),
    (
        "validate-real-xz-garbage",
        ["validate", "--real", "r.json.xz", "--output-dir", "out"],
        {"r.json.xz": b"not xz at all"},
    ),
    ("validate-real-dir", ["validate", "--real", "adir", "--output-dir", "out"], {"adir/x": "1"}),
    (
        "validate-output-file",
        ["validate", "--real", "r.json", "--output-dir", "afile"],
        {"afile": "x", "r.json": "[]"},
    ),
    # ---- plot ----
    ("plot-missing-dir", ["plot", "nowhere"], {}),
    ("plot-empty-summary", ["plot", "d"], {"d/summary.csv": ""}),
    ("plot-header-only", ["plot", "d"], {"d/summary.csv": "block_size,request_throughput\n"}),
    ("plot-binary-summary", ["plot", "d"], {"d/summary.csv": b"\xff\xfe\x00\x81"}),
    (
        "plot-bad-format",
        ["plot", "d", "--format", "bmpx"],
        {"d/summary.csv": "block_size,request_throughput\n16,1.0\n32,2.0\n"},
    ),
    (
        "plot-bad-kind",
        ["plot", "d", "--kind", "pie"],
        {"d/summary.csv": "block_size,request_throughput\n16,1.0\n32,2.0\n"},
    ),
    (
        "plot-bad-curve-by",
        ["plot", "d", "--curve-by", "nope"],
        {"d/summary.csv": "block_size,request_throughput\n16,1.0\n32,2.0\n"},
    ),
    ("plot-a-file", ["plot", "afile"], {"afile": "x"}),
    (
        "plot-output-file",
        ["plot", "d", "--output-dir", "afile"],
        {"afile": "x", "d/summary.csv": "block_size,request_throughput\n16,1.0\n32,2.0\n"},
    ),
    # ---- parity ----
    ("parity-binary", ["parity", "g.json"], {"g.json": b"\xff\xfe\x00\x01"}),
    ("parity-empty", ["parity", "g.json"], {"g.json": ""}),
    ("parity-empty-gz", ["parity", "g.json.gz"], {"g.json.gz": b""}),
    ("parity-bad-gz", ["parity", "g.json.gz"], {"g.json.gz": b"\x1f\x8bnot gzip really"}),
    ("parity-list", ["parity", "g.json"], {"g.json": "[]"}),
    ("parity-null", ["parity", "g.json"], {"g.json": "null"}),
    (
        "parity-truncated",
        ["parity", "g.json"],
        {"g.json": '{"format": "pagesim-parity", "steps": ['},
    ),
    ("parity-missing", ["parity", "nowhere.json"], {}),
    ("parity-bad-block-ids", ["parity", "--block-ids", "fuzzy"], {}),
    # ---- calibrate / validate without GPU: argument checks first ----
    ("calibrate-block-sizes-text", ["calibrate", "--block-sizes", "a,b"], {}),
    ("calibrate-block-sizes-zero", ["calibrate", "--block-sizes", "0"], {}),
    ("calibrate-budget-nan", ["calibrate", "--time-budget-s", "nan"], {}),
    ("calibrate-output-file", ["calibrate", "--output-dir", "afile"], {"afile": "x"}),
    ("calibrate-model-bogus", ["calibrate", "--model", "gpt-9"], {}),
    ("validate-gpu-rate-nan", ["validate", "--request-rate", "nan"], {}),
    ("validate-gpu-repeats-0", ["validate", "--repeats", "0"], {}),
]

# Absurd-looking values that are valid: each runs and exits 0 (a low rate used to allocate one
# bucket per simulated second; it now costs nothing: 2e-8 is the least for 20 prompts, 1e9 s).
VALID = [
    ("request-rate-tiny", [*RUN, "--request-rate", "2e-8"], {}),
    ("block-size-odd", [*RUN, "--block-size", "17"], {}),
    ("max-concurrency-huge", [*RUN, "--max-concurrency", "1099511627776"], {}),
    ("seed-huge", [*RUN, "--seed", "100000000000000000000000"], {}),
    ("result-filename-new-folder", [*RUN, "--save-result", "--result-filename", "a/b.json"], {}),
]


def _decode_rows(kind: str) -> str:
    head = "block_size,batch_size,context_len,step_time_ms,step_time_p10_ms,step_time_p90_ms,attention_ms,other_ms\n"
    value = {"ZERO_DECODE": "0", "NAN_DECODE": "nan", "NEG_DECODE": "-5", "TEXT_DECODE": "fast"}
    if kind == "ONE_ROW_DECODE":
        return head + "16,1,128,5.5,5.5,5.7,0.18,5.3\n"
    v = value[kind]
    rows = [f"16,{b},{c},{v},{v},{v},{v},{v}\n" for b in (1, 2, 4, 8) for c in (128, 512, 1024)]
    return head + "".join(rows)


def _write(root: Path, files: dict[str, str | bytes | None]) -> None:
    shipped = calibration_dir() / "h200" / "llama-2-7b"
    if any(k.startswith("PROFILE/") for k in files):
        shutil.copytree(shipped, root / "prof", ignore=shutil.ignore_patterns("*_inputs*", "tp2*"))
        shutil.copytree(root / "prof", root / "prof2")
    if any(k.startswith("SWEEP/") for k in files):
        argv = ["sweep", "--quiet", "--num-prompts", "5", "--block-size", "16"]
        assert main([*argv, "--output-dir", str(root / "sw")]) == 0
        next((root / "sw").iterdir()).rename(root / "sw-s")
        (root / "sw-s").rename(root / "sw")
    for name, content in files.items():
        if content is None:
            continue
        name = name.replace("PROFILE/", "prof/")
        name = name.replace("SWEEP/", "sw/")
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if content == "DEVICE_TEXT":
            import json

            meta = json.loads((shipped / "profile.json").read_text())
            meta["num_sms"] = "many"
            content = json.dumps(meta)
        elif isinstance(content, str) and content.endswith("_DECODE"):
            content = _decode_rows(content)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)


@pytest.fixture(scope="module", autouse=True)
def _warm() -> None:
    """Import what the commands import, so that no case's 10 s pays for the first import."""
    import matplotlib.pyplot  # noqa: F401

    import pagesim.planning.sweep  # noqa: F401
    import pagesim.sim.simulate  # noqa: F401

    with contextlib.redirect_stdout(io.StringIO()):
        main(["run", "--quiet", "--num-prompts", "2"])


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout


def test_corpus_has_enough_cases() -> None:
    ids = [c[0] for c in CASES]
    assert len(ids) == len(set(ids))
    assert len(ids) >= 150


@pytest.mark.parametrize(("argv", "files"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input(argv, files, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, files)
    err, out = io.StringIO(), io.StringIO()
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(10)
    t0 = time.perf_counter()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            rc = main(list(argv))
    except _Timeout:
        pytest.fail("no answer within 10 s")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    elapsed = time.perf_counter() - t0
    lines = [line for line in err.getvalue().splitlines() if line.strip()]
    assert "Traceback" not in err.getvalue()
    assert rc == 2, (rc, err.getvalue()[-2000:])
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: ")
    assert elapsed < 10


@pytest.mark.parametrize(("argv", "files"), [c[1:] for c in VALID], ids=[c[0] for c in VALID])
def test_absurd_but_valid(argv, files, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, files)
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(list(argv)) == 0
