"""slo-console core: workloads, metrics, simulator, backends, tuning, energy and factsheets.

Nothing in core imports Textual or the console package.
"""

__version__ = "0.1.0"
