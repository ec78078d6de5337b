"""The exit codes of every slo-console command (batch runs, the console, the gateway): one definition.

The README's CLI reference and each parser's epilog quote `EXIT_CODES_HELP`.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    USAGE = 2  # bad usage, profile, mode, port or option (argparse's own code for usage errors)
    BACKEND = 3  # the backend is unavailable: the server or an upstream cannot be reached or started
    FAILED = 4  # the job ran and failed: nothing was measured, or a calibration could not be fitted
    INTERRUPTED = 130  # Ctrl-C (128 + SIGINT); what was measured is kept


EXIT_CODES_HELP = (
    "Exit codes: 0 ok, 2 bad usage or profile, 3 backend unavailable, 4 the job failed (nothing measured), "
    "130 interrupted."
)
