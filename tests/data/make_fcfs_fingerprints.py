"""Regenerate tests/data/fcfs_fingerprints.json: python tests/data/make_fcfs_fingerprints.py

Do this only for a deliberate change of the simulator's model, named in the commit that changes it: the file
pins what fcfs (vLLM's default) does on every shipped profile, so refactors of the simulation cannot drift.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.sim_fingerprint import FINGERPRINT_REQUESTS, fingerprint_profile

OUT = Path(__file__).with_name("fcfs_fingerprints.json")

if __name__ == "__main__":
    profiles = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "profiles").glob("*.yaml"))
    data = {"requests_cap": FINGERPRINT_REQUESTS, "profiles": {name: fingerprint_profile(name) for name in profiles}}
    OUT.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUT}")
