"""slo-console core: workloads, metrics, simulator, backends, tuning, energy and factsheets.

Nothing in core imports Textual or the console package.
"""

__version__ = "0.1.0"

# The hot modules setup.py compiles with mypyc on a regular `pip install .` (editable installs stay pure):
# benchmarks/mypyc_probe/README.md. Keep the other modes' core/control, console/ and the pydantic-based modules
# out (see there why).
COMPILED_MODULES = (
    "core.sim.blocks",
    "core.sim.sim_request",
    "core.sim.decode_runs",
    "core.sim.clients",
    "core.sim.replica_base",
    "core.sim.replica",
    "core.sim.stepwise",
    "core.step_planner_api",
    "core.sim.engine",
    "core.sim.stalls",
    "core.sim.reach",
    "core.records",
    "core.engine_sample",
    "core.load_plan",
    "core.step_time",
    "core.workload.sending",
    "core.workload.plan",
    "core.jobs.run",
    "core.metrics.window",
    "core.metrics.outcomes",
    "core.metrics.itl",
    "core.metrics.smooth_goodput",
    "core.backends.sim",
    "core.control.slos_serve.admission",
    "core.control.slos_serve.batching",
    "core.control.slos_serve.budget",
    "core.control.slos_serve.policy",
    "core.control.slos_serve.step_requests",
    "core.control.slos_serve.stepping",
    "core.control.slos_serve.virtual",
    "core.control.adaserve.policy",
    "core.control.adaserve.scheduler",
    "core.control.adaserve.speculation",
    "core.control.adaserve.step_lengths",
    "core.control.adaserve.stretch",
)


def compiled() -> list[str]:
    """The modules of COMPILED_MODULES that this process loads as mypyc-compiled extensions (empty: pure Python).

    Looks up the modules' files without importing them (each package's __init__ is imported, as for any
    import).
    """
    from importlib.machinery import ExtensionFileLoader
    from importlib.util import find_spec

    return [
        name for name in COMPILED_MODULES if isinstance(getattr(find_spec(name), "loader", None), ExtensionFileLoader)
    ]
