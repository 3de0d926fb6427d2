"""benchmarks/README.md shows every table its result files hold, as the scripts wrote them.

A benchmark script writes its table (``"table"``, or ``"summary"`` for the codec overhead runs)
into its result file; the README copies it. A rerun that changes the file and not the README, or
a README table edited by hand, fails here.
"""

import json
import re
from pathlib import Path

import pytest

from benchmarks.common import RESULTS

README = RESULTS.parent / "README.md"
TABLE_KEYS = ("table", "summary")


def cited_results() -> list[Path]:
    """Result files benchmarks/README.md names (``NAME.json`` or ``NAME.{json,png}``)."""
    names = sorted(set(re.findall(r"\b([a-z0-9_]+)\.\{?json\b", README.read_text())))
    return [RESULTS / f"{name}.json" for name in names if (RESULTS / f"{name}.json").exists()]


def tables_of(path: Path) -> list[str]:
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        return []
    tables = []
    for key in TABLE_KEYS:
        value = data.get(key)
        tables += [value] if isinstance(value, str) else list(value) if isinstance(value, list) else []
    return [t.strip() for t in tables if isinstance(t, str)]  # engine.json's "summary" is numbers


def test_the_readme_cites_the_result_files_of_its_sections():
    names = {p.stem for p in cited_results()}
    assert {"engine", "throughput", "efficiency", "hybrid", "slow_link", "slow_link_low", "slow_link_auto",
            "memory", "engine_slow_link", "docstrings_seeds", "compressors_overhead", "message_cost"} <= names


@pytest.mark.parametrize("path", cited_results(), ids=lambda p: p.stem)
def test_each_table_of_a_cited_file_is_in_the_readme_as_written(path):
    readme = README.read_text()
    for table in tables_of(path):
        assert table in readme, (
            f"benchmarks/README.md does not show {path.name}'s table as the script wrote it; paste the file's"
            f" table in place of the README's:\n{table[:400]}"
        )
