"""Regenerate tests/data/adaserve_fingerprints.json: python tests/data/make_adaserve_fingerprints.py

The file pins what AdaServe and the static-speculation baseline do on fixed seeds (every request's timeline
and the summary figures), so optimisations of the per-step path cannot change results. Regenerate it only
for a deliberate change of the model or the algorithm, named in the commit that changes it.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.adaserve_fingerprint import CASES, fingerprint_case

OUT = Path(__file__).with_name("adaserve_fingerprints.json")

if __name__ == "__main__":
    data = {"cases": {name: fingerprint_case(name) for name in CASES}}
    OUT.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUT}")
