"""SLO-Tuner (paper 000): the goodput hill-climb, stronger searches, journal/resume, simulator guidance.

Entry point: `core.tune.job.run_tune`. Pieces: knobspace (K and its neighbours), score (eqs. 2-3),
segment (one measurement on the simulator or a restarted vLLM), evaluator (memo, journal, budget),
hillclimb (Algorithm 1), search (successive halving, simulator-ranked hill-climb), guided (simulator first,
verify live), journal (JSONL, fsync, resume).
"""
