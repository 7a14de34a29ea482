"""``convplane up`` refuses a plane it could never bring up, before it starts anything."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from services.cli.main import build_app


@pytest.mark.parametrize("regions", [0, 1, 8])
def test_up_refuses_a_region_count_that_could_never_elect_a_leader(
    regions: int, tmp_path: Path
) -> None:
    state_dir = tmp_path / "plane"
    result = CliRunner().invoke(
        build_app(),
        ["up", "--regions", str(regions), "--state-dir", str(state_dir), "--base-port", "0"],
    )
    assert result.exit_code == 1, result.output
    assert "--regions must be 2..7" in result.output
    assert not state_dir.exists()  # no database, key or cluster file was made
