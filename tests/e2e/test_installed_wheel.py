"""convplane as a user installs it: the wheel built from a clean copy of the tree, installed in a
fresh virtualenv, run from a directory that is not the repository (one that even holds folders
named ``replay`` and ``services``), with no ``PYTHONPATH``. And a clashing package fails
loudly, naming what clashes (``services.deploy.installation``).

Slow (the virtualenv installs every dependency: pip's cache and ``PIP_FIND_LINKS`` help), so
one virtualenv serves the whole module, and the test that breaks it runs last."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
INSTALL_TIMEOUT_S = 900
RUN_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The virtualenv's ``bin`` with the wheel installed."""
    base = tmp_path_factory.mktemp("wheel")
    source = base / "src"
    for name in _tracked_files():  # a clean copy: no build/ left over from an earlier build
        target = source / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO_ROOT / name, target)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(base / "dist"),
          str(source)], cwd=base, timeout=INSTALL_TIMEOUT_S)  # fmt: skip
    (wheel,) = (base / "dist").glob("convplane-*.whl")
    venv.create(base / "venv", with_pip=True)
    bin_dir = base / "venv" / "bin"
    _run([str(bin_dir / "pip"), "install", "-q", str(wheel)], cwd=base, timeout=INSTALL_TIMEOUT_S)
    yield bin_dir


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    """A working directory with decoys: folders named like two of convplane's packages."""
    for decoy in ("replay", "services"):
        (tmp_path / decoy).mkdir()
        (tmp_path / decoy / "__init__.py").write_text("raise ImportError('a decoy')\n")
    return tmp_path


def test_the_wheel_holds_no_test_harness(installed: Path) -> None:
    site = next((installed.parent / "lib").glob("python3*/site-packages"))
    assert (site / "services" / "local" / "plane.py").is_file()
    assert (site / "services" / "console" / "static" / "index.html").is_file()
    assert (site / "eventlog" / "migrations" / "versions").is_dir()
    assert (site / "replay" / "kafka" / "pom.xml").is_file()
    assert not list(site.glob("services/local/chaos*.py"))
    assert not (site / "tests").exists()


def test_the_demo_runs_from_any_directory(installed: Path, elsewhere: Path) -> None:
    result = _run([str(installed / "convplane"), "demo"], cwd=elsewhere, timeout=RUN_TIMEOUT_S)
    assert "tool attempt" in result.stdout and "plane stopped." in result.stdout


def test_up_down_and_sim_run_from_any_directory(installed: Path, elsewhere: Path) -> None:
    """Regions of two nodes each, stopped and started again on their data: every node of the
    restarted plane answers."""
    convplane = str(installed / "convplane")
    state_dir = elsewhere / "plane"
    up = [convplane, "up", "--regions", "2", "--nodes-per-region", "2", "--state-dir",
          str(state_dir), "--base-port", "0", "--shard-count", "8", "--detach"]  # fmt: skip
    try:
        _run(up, cwd=elsewhere, timeout=RUN_TIMEOUT_S)
        _run([convplane, "down", "--state-dir", str(state_dir)], cwd=elsewhere)
        _run(up, cwd=elsewhere, timeout=RUN_TIMEOUT_S)  # the same plane, on its data
        plane = json.loads((state_dir / "cluster.json").read_text())
        nodes = [
            u for r in plane["regions"] for u in [r["url"], *(n["url"] for n in r["more_nodes"])]
        ]
        assert len(nodes) == 4
        for url in nodes:
            assert httpx.get(url + "/healthz", timeout=10, trust_env=False).status_code == 200
    finally:
        subprocess.run([convplane, "down", "--state-dir", str(state_dir)], cwd=elsewhere,
                       env=_clean_env(), capture_output=True, timeout=RUN_TIMEOUT_S)  # fmt: skip
    sim = _run([convplane, "sim", "--seeds", "2", "--nodes-per-region", "2"], cwd=elsewhere,
               timeout=RUN_TIMEOUT_S)  # fmt: skip
    assert "passed" in sim.stdout
    for command in ("node", "worker", "drill"):
        _run([convplane, command, "--help"], cwd=elsewhere)


def test_a_clashing_package_fails_loudly(installed: Path, tmp_path: Path) -> None:
    """Last: it installs a clashing distribution into the module's virtualenv."""
    convplane = str(installed / "convplane")
    shadow = tmp_path / "shadow"
    (shadow / "replay").mkdir(parents=True)
    (shadow / "replay" / "__init__.py").write_text("")
    shadowed = subprocess.run(
        [convplane, "--help"], cwd=tmp_path, env={**_clean_env(), "PYTHONPATH": str(shadow)},
        capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
    )  # fmt: skip
    assert shadowed.returncode != 0
    assert f"'replay' was imported from {shadow / 'replay'}" in shadowed.stderr, shadowed.stderr

    clash = tmp_path / "clash"
    (clash / "regions").mkdir(parents=True)
    (clash / "regions" / "__init__.py").write_text("")
    (clash / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "clashing-regions"\nversion = "1.0"\n'
        '[tool.setuptools]\npackages = ["regions"]\n'
    )
    _run([str(installed / "pip"), "install", "-q", "--no-deps", str(clash)], cwd=tmp_path,
         timeout=INSTALL_TIMEOUT_S)  # fmt: skip
    clashed = subprocess.run([convplane, "--help"], cwd=tmp_path, env=_clean_env(),
                             capture_output=True, text=True, timeout=RUN_TIMEOUT_S)  # fmt: skip
    assert clashed.returncode != 0
    assert "clashing-regions also installs a top-level package 'regions'" in clashed.stderr, (
        clashed.stderr
    )


def _tracked_files() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO_ROOT,
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return [name for name in listed.split("\0") if name and (REPO_ROOT / name).is_file()]


def _clean_env() -> dict[str, str]:
    """This environment without what would lead a child to the source tree or our venv."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["COLUMNS"] = "200"
    return env


def _run(
    command: list[str], *, cwd: Path, timeout: float = RUN_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(command, cwd=cwd, env=_clean_env(), capture_output=True, text=True,
                            timeout=timeout)  # fmt: skip
    assert result.returncode == 0, f"{command}:\n{result.stdout}\n{result.stderr}"
    return result
