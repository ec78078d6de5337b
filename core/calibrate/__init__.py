"""Calibration: measure a live server with a short profiling sweep and fit the simulator's performance model.

sweep.py              the sweep: what to measure (decode step time vs batch and context, prefill time vs
                      prompt length, speculation cost and acceptance) and running it on a target
sweep_points.py       its settings, the points it plans, and what it records per point
sweep_targets.py      what it measures: a vLLM it starts, a running server, or the simulator; server facts
engine_counters.py    vLLM's engine-timed /metrics sums and counts over a point
step_observations.py  how request records and engine counters become step observations for the fit
fit.py                the roofline fit (paper 004 sec. 3.1.1) and the calibration profile it becomes
job.py                `--job calibrate`: sweep, fit, write the calibration YAML, events on a sink
"""
