"""SABER (paper 001): SLA-aware admission in front of a continuous-batching engine.

speed_model.py  the offline phase (sec. IV-B): per-request token speed against concurrency, f(L) fitted (USL)
policy.py       the online phase (sec. IV-C, Algorithm 1): two-tier queue, windowed admission, low tier
speed_drift.py  beyond the paper: how far a live engine's speed drifted from f(L), to scale the admissions
"""
