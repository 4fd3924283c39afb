"""Bulk decodes: the simulator's fast path for routine decode steps, byte-identical to the
step-by-step path. `decodes` decides which running requests a step accounts in bulk and keeps
their sums; `fills` says when the blocks they fill join the prefix cache."""
