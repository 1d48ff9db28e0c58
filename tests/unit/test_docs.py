"""docs/configuration.md is generated from Settings and must not go stale."""

from __future__ import annotations

from queue_processor.cli import configuration_markdown
from queue_processor.config import Settings
from tests.conftest import ROOT

DOC = ROOT / "docs" / "configuration.md"


def test_every_setting_is_documented() -> None:
    text = DOC.read_text()
    missing = [name.upper() for name in Settings.model_fields if f"`{name.upper()}`" not in text]
    assert not missing, f"missing from docs/configuration.md: {missing}; run `make docs`"


def test_the_reference_is_up_to_date() -> None:
    assert DOC.read_text() == configuration_markdown(), "docs/configuration.md is stale; run `make docs`"


def test_every_setting_has_a_description_and_an_nth_note() -> None:
    for name, info in Settings.model_fields.items():
        assert info.description, name
        extra = info.json_schema_extra
        assert isinstance(extra, dict), name
        assert extra.get("nth"), name
