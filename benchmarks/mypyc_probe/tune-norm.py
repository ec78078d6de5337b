"""usage: python tune-norm.py OUT.jsonl -> the tune job's stdout without its timing fields, lines sorted.

Two tune runs differ in their timings and in the process pool's completion order only: compare the outputs of
this script (compiled install vs pure install).
"""

import json
import sys
from typing import Any

DROP = {"wall_s", "cpu_s", "done", "started", "tune_wall_s", "sim_wall_s"}


def strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: strip(v) for k, v in value.items() if k not in DROP}
    if isinstance(value, list):
        return [strip(v) for v in value]
    return value


with open(sys.argv[1]) as lines:
    print("\n".join(sorted(json.dumps(strip(json.loads(line)), sort_keys=True) for line in lines if line.strip())))
