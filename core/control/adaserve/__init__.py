"""AdaServe (paper 002): SLO-customized speculative decoding with per-request token trees.

policy.py       the mode: the Policy and the replica's StepPlanner (Algorithm 2, step by step)
scheduler.py    the per-step decode budget and tree shapes (sec. 4), free of the engine
trees.py        Algorithm 1 (optimal construction), beam search, Algorithm 2's selection, eqs. 8-9, on nodes
speculation.py  the simulator's token-level model: ranked-geometric drafts, mismatch, batch select/verify
live.py         live servers: the speculation width a live vLLM is started with (no per-request trees there)
"""
