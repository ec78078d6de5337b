"""The scheduling modes, one package per paper: saber/ (paper 001), adaserve/ (paper 002), slos_serve/ (paper 004),
and the static concurrency cap. Their seams are core/controller_api.py (Policy) and core/step_planner_api.py
(StepPlanner); the registry by name is core/modes.py; the live gateway that runs them is core/gateway/."""
