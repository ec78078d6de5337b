"""python -m core.factsheet [--check]: regenerate (or check) schema/factsheet.schema.json."""

from core.factsheet.schema import main

raise SystemExit(main())
