from pagesim.config import EngineConfig
from pagesim.sim.build import default_profile
from pagesim.sim.simulate import LoadSpec, simulate

config = EngineConfig.create(model="llama-3-8b", gpu="h200", block_size=16)
profile = default_profile(config)  # the shipped H200 calibration; None: analytical
for rate in (4.0, 8.0, 16.0):
    load = LoadSpec(workload="chat", num_prompts=300, request_rate=rate, seed=0)
    r = simulate(config, load, profile=profile).result  # vllm bench serve's keys + pagesim's
    print(f"{rate:g} req/s: p99 TTFT {r['p99_ttft_ms']:.1f} ms, p99 TPOT {r['p99_tpot_ms']:.2f} ms")
