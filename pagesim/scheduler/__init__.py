"""vLLM v1's scheduling model over the shared KV-cache core (no SimPy, no torch)."""
