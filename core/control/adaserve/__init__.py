"""AdaServe (paper 002): SLO-customized speculative decoding with per-request token trees.

trees.py        Algorithm 1 (optimal construction), beam search, Algorithm 2's selection, eqs. 8-9, on nodes
speculation.py  the simulator's token-level model: ranked-geometric drafts, mismatch, batch select/verify
"""
