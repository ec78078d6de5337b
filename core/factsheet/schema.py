"""The published JSON Schema of the factsheet, generated from the pydantic model.

schema/factsheet.schema.json is this output, committed; a test fails when the model changes and the file
was not regenerated. Regenerate with:  python -m core.factsheet  (add --check to only compare).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from core.factsheet.model import SCHEMA_VERSION, Factsheet

# The committed file in a checkout (the generator is a developer's tool: an installed package has no schema/).
SCHEMA_PATH = Path(__file__).resolve().parent.parent.parent / "schema" / "factsheet.schema.json"


def factsheet_json_schema() -> dict[str, Any]:
    """JSON Schema (draft 2020-12) of the factsheet JSON as written (aliases, serialised types)."""
    schema = Factsheet.model_json_schema(by_alias=True, mode="serialization")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": f"slo-console factsheet {SCHEMA_VERSION}",
        **{key: value for key, value in schema.items() if key != "title"},
    }


def schema_text() -> str:
    return json.dumps(factsheet_json_schema(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None, path: Path = SCHEMA_PATH) -> int:
    args = sys.argv[1:] if argv is None else argv
    text = schema_text()
    if "--check" in args:
        current = path.read_text(encoding="utf-8") if path.exists() else ""
        if current != text:
            print(f"{path} is out of date; run: python -m core.factsheet", file=sys.stderr)
            return 1
        return 0
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    print(f"wrote {path}")
    return 0
