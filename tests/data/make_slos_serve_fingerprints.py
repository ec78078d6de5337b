"""Regenerate tests/data/slos_serve_fingerprints.json: python tests/data/make_slos_serve_fingerprints.py

The file pins what SLOs-Serve does on fixed seeds (every request's timeline and the summary figures), so
optimisations of its planner cannot change results. Generated on the tree before issue 22's speed work
(db70735); regenerate it only for a deliberate change of the model or the algorithm, named in the commit.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.slos_serve_fingerprint import CASES, fingerprint_case

OUT = Path(__file__).with_name("slos_serve_fingerprints.json")

if __name__ == "__main__":
    data = {"cases": {name: fingerprint_case(name) for name in CASES}}
    OUT.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUT}")
