"""Calibration: measure a live server with a short profiling sweep and fit the simulator's performance model.

sweep.py  what to measure (decode step time vs batch and context, prefill time vs prompt length,
          speculation cost and acceptance) and how to turn request records into step observations
fit.py    the roofline fit (paper 004 sec. 3.1.1) and the calibration profile it becomes
job.py    `--job calibrate`: sweep, fit, write the calibration YAML, events on a sink
"""
