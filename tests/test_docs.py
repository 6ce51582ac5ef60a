"""The README tells the truth: its option table is the code's, and it opens with the two commands."""

from __future__ import annotations

import re
from pathlib import Path

from spark_qtransport.options import OPTIONS, WRITER_OPTIONS
from spark_qtransport.queues.messages import INPUT_COLUMNS
from spark_qtransport.source import SCHEMA

README = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")


def _table(section: str) -> list[list[str]]:
    body = re.split(rf"\n#+ {section}\n", README, maxsplit=1)[1]
    body = re.split(r"\n#+ ", body, maxsplit=1)[0]
    rows = [line for line in body.splitlines() if line.startswith("| ") and not line.startswith("|---")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[1:]]


def test_readme_opens_with_demo_and_test_commands() -> None:
    first_block = README.split("```bash\n", 1)[1].split("```", 1)[0]
    assert [line.split("#")[0].strip() for line in first_block.strip().splitlines()] == ["make demo", "make test"]


def test_options_table_matches_the_code() -> None:
    rows = _table("Options")
    assert [r[0].strip("`") for r in rows] == list(OPTIONS)
    for key, default, meaning in rows:
        assert (default, meaning) == OPTIONS[key.strip("`")], key


def test_output_columns_table_matches_the_schema() -> None:
    rows = _table("Output columns")
    assert [r[0].strip("`") for r in rows] == SCHEMA.fieldNames()
    for name, typ, _ in rows:
        assert re.sub(r"\s", "", SCHEMA[name.strip("`")].dataType.simpleString()) == typ.replace("long", "bigint"), name


def test_sink_options_table_matches_the_code() -> None:
    rows = _table("Sink options")
    assert [r[0].strip("`") for r in rows] == list(WRITER_OPTIONS)
    for key, default, meaning in rows:
        assert (default, meaning) == WRITER_OPTIONS[key.strip("`")], key


def test_input_columns_table_matches_the_code() -> None:
    assert [r[0].strip("`") for r in _table("Input columns")] == list(INPUT_COLUMNS)
