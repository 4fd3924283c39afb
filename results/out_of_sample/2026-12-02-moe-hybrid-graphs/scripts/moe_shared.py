"""Diagnostic: experts routed per MoE layer in served decode batches whose prompts share a long
prefix (a system prompt, prefix caching on) against batches of distinct prompts."""
import random, statistics, sys, time, os, torch
import pagesim.gpu.model as gm
from pagesim.config import EngineConfig
from pagesim.gpu.runner import GPUModelRunner, RunnerConfig
from pagesim.gpu.serve import make_engine
from pagesim.request import Request
seen = []
orig = gm.route
def spy(logits, k):
    w, ids = orig(logits, k); seen.append(len(torch.unique(ids))); return w, ids
gm.route = spy
model = sys.argv[1] if len(sys.argv) > 1 else "qwen3-30b-a3b"
DEV = os.environ.get("DEV", "cuda")
P, T = (1024, 256) if DEV == "cuda" else (48, 8)
cfg = EngineConfig.create(model=model, gpu="h200", block_size=16, max_num_seqs=64, max_num_batched_tokens=8192, max_model_len=4096 if DEV == "cuda" else 256, enable_prefix_caching=True)
NB = 8000 if DEV == "cuda" else 700
r = GPUModelRunner(cfg, NB, RunnerConfig(device=DEV, dtype=torch.bfloat16 if DEV == "cuda" else torch.float32, seed=0, cuda_graphs=False))
def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()
rng = random.Random(1)
for shared in (0, P):
    for b in ((8, 16, 32) if DEV == "cuda" else (4,)):
        s = make_engine(cfg, NB)
        prefix = [rng.randrange(100000) for _ in range(shared)]
        for i in range(b):
            tail = [rng.randrange(100000) for _ in range(P + T - shared)]
            s.add_request(Request(f"p{shared}-b{b}-{i}", prefix + tail, max_tokens=40))
        ts, es = [], []
        for step in range(60):
            if not s.has_unfinished_requests():
                break
            o = s.schedule(); seen.clear()
            sync(); t = time.perf_counter(); res = r.execute_model(o); sync(); dt = time.perf_counter() - t
            s.update_from_output(o, res)
            if o.scheduled and all(x.num_new_tokens == 1 for x in o.scheduled) and len(o.scheduled) == b:
                ts.append(dt * 1e3); es.append(statistics.mean(seen))
        print(f"shared prefix {shared:5d} of {P + T} tokens, batch {b:3d}: experts/layer {statistics.mean(es):6.1f}, eager step {statistics.median(ts):7.2f} ms ({len(ts)} steps)", flush=True)
        del s
