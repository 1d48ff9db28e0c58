"""docs/migration.md against NTH v1.25.6's own settings (``tests/migration/nth.py``): every variable NTH reads
and every value its chart offers has a row that says what became of it."""

from __future__ import annotations

import re

from tests.conftest import ROOT
from tests.migration import nth

GUIDE = (ROOT / "docs" / "migration.md").read_text()


def first_column(section: str, *, older: bool = True) -> set[str]:
    """The backticked names in the first column of the table under ``## <section>`` (``.key`` continues the
    previous name); without ``older``, not those of rows about "older NTH charts"."""
    body = GUIDE.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    names: set[str] = set()
    for line in body.splitlines():
        if not line.startswith("| ") or line.startswith("| (none)"):
            continue
        if not older and "older NTH charts" in line:
            continue
        names.update(name for name in re.findall(r"`([^`]+)`", line.split(" | ", 1)[0]) if name[0] != ".")
    return names


def placed(key: str, names: set[str]) -> bool:
    """``key`` is a row of its own, a sub-key's (``serviceAccount.create``) or a wildcard's (``daemonset*``)."""
    return any(
        name == key or name.startswith(key + ".") or (name.endswith("*") and key.startswith(name[:-1]))
        for name in names
    )


def test_every_variable_nth_reads_has_a_row() -> None:
    names = first_column("Environment variables")
    assert not sorted(env for env in nth.ENV if not placed(env, names))


def test_every_value_of_nths_chart_has_a_row() -> None:
    names = first_column("Helm values")
    assert not sorted(key for key in nth.HELM_VALUES if not placed(key, names))


def test_no_row_names_an_nth_setting_that_does_not_exist() -> None:
    """A row that claims an NTH name NTH does not have (``taintEffect`` was one: NTH's chart has no such
    value) misleads the reader into looking for it."""
    env = {name for name in first_column("Environment variables", older=False) if "*" not in name}
    helm = {name.split(".")[0] for name in first_column("Helm values", older=False) if "*" not in name}
    assert not sorted(env - nth.ENV)
    assert not sorted(helm - nth.HELM_VALUES)
