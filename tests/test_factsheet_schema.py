"""The published JSON Schema: committed file equals the generated one, and factsheets validate against it."""

from __future__ import annotations

import json

import jsonschema
import pytest

from core.energy import EnergyReading
from core.factsheet import build_factsheet, factsheet_json_schema, render_json
from core.factsheet.schema import main as schema_main
from core.factsheet.schema import schema_text
from tests.fakes import PUBLISHED_SCHEMA
from tests.test_factsheet import live_inputs, sim_inputs


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(PUBLISHED_SCHEMA.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_committed_schema_is_the_generated_one() -> None:
    assert PUBLISHED_SCHEMA.read_text(encoding="utf-8") == schema_text(), (
        "schema/factsheet.schema.json is stale; run: python -m core.factsheet"
    )
    assert schema_main(["--check"], PUBLISHED_SCHEMA) == 0


def test_schema_is_versioned() -> None:
    schema = factsheet_json_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["properties"]["schema_version"]["const"] == "1.2"


@pytest.mark.parametrize(
    "inputs",
    [
        pytest.param(sim_inputs, id="simulator-modelled-energy"),
        pytest.param(live_inputs, id="live-measured-energy-tuned"),
        pytest.param(lambda: sim_inputs(energy=None, summary={}), id="no-energy-empty-summary"),
        pytest.param(
            lambda: sim_inputs(energy=EnergyReading(None, None, 0.05, "unavailable", "NVML", reason="too short")),
            id="unavailable-energy",
        ),
    ],
)
def test_factsheet_json_validates(validator: jsonschema.Draft202012Validator, inputs) -> None:
    data = json.loads(render_json(build_factsheet(inputs())))
    errors = sorted(validator.iter_errors(data), key=str)
    assert errors == []


def test_schema_rejects_a_made_up_basis(validator: jsonschema.Draft202012Validator) -> None:
    data = json.loads(render_json(build_factsheet(sim_inputs())))
    data["sustainability"]["energy_j"]["basis"] = "guessed"
    assert not validator.is_valid(data)


def test_schema_rejects_unknown_sections(validator: jsonschema.Draft202012Validator) -> None:
    data = json.loads(render_json(build_factsheet(sim_inputs())))
    data["marketing"] = {"fastest": True}
    assert not validator.is_valid(data)
