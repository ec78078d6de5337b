"""Factsheets: what a run measured, modelled and could not know, as JSON (canonical) and Markdown.

Usage: build_factsheet(FactsheetInputs(...)) -> Factsheet; write_factsheet(f, out_dir) writes
factsheet.json and factsheet.md. The JSON validates against schema/factsheet.schema.json.
"""

from core.factsheet.build import FactsheetInputs, build_factsheet
from core.factsheet.host import detect_host, git_revision
from core.factsheet.model import SCHEMA_VERSION, Factsheet, HostInfo
from core.factsheet.render import render_json, render_markdown, write_factsheet
from core.factsheet.schema import factsheet_json_schema

__all__ = [
    "SCHEMA_VERSION",
    "Factsheet",
    "FactsheetInputs",
    "HostInfo",
    "build_factsheet",
    "detect_host",
    "factsheet_json_schema",
    "git_revision",
    "render_json",
    "render_markdown",
    "write_factsheet",
]
