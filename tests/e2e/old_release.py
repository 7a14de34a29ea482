"""The pinned earlier release of convplane, installed as its users installed it: the wheel
built from that commit of this repository's own history (``git archive``), in a virtualenv of
its own. Built once per machine and commit, under ``.cache/upgrade/<commit>/`` (git-ignored),
and reused while its ``ready`` marker is there.

A clone without the commit (a shallow one) fails loudly: the upgrade test must run against the
release, never be skipped. ``python -m tests.e2e.old_release`` builds it ahead of a run."""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
#: main as of issue 33's items 1-3 and 6: nodes that send no peer protocol headers
PINNED_COMMIT = "83d929a94f5ef819247bdcacd5b40b36eac05262"
INSTALL_TIMEOUT_S = 900


class PinnedReleaseMissing(RuntimeError):
    """The pinned commit is not in this clone."""


def old_release(commit: str = PINNED_COMMIT) -> Path:
    """The ``bin`` directory of a virtualenv with ``commit``'s wheel installed."""
    cache = REPO_ROOT / ".cache" / "upgrade" / commit
    bin_dir = cache / "venv" / "bin"
    if (cache / "ready").exists():
        return bin_dir
    found = subprocess.run(["git", "-C", str(REPO_ROOT), "cat-file", "-e", f"{commit}^{{commit}}"],
                           capture_output=True, text=True)  # fmt: skip
    if found.returncode != 0:
        raise PinnedReleaseMissing(
            f"commit {commit} (the pinned earlier release the upgrade test runs from) is not "
            f"in {REPO_ROOT}: a shallow clone? fetch the history (git fetch --unshallow)"
        )
    shutil.rmtree(cache, ignore_errors=True)
    source = cache / "src"
    source.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO_ROOT), "archive", "--format=tar", commit],
                             capture_output=True, check=True)  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive.stdout, check=True)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(cache / "dist"),
          str(source)], cwd=cache)  # fmt: skip
    (wheel,) = (cache / "dist").glob("convplane-*.whl")
    venv.create(cache / "venv", with_pip=True)
    _run([str(bin_dir / "pip"), "install", "-q", str(wheel)], cwd=cache)
    shutil.rmtree(source)
    (cache / "ready").touch()
    return bin_dir


def _run(command: list[str], *, cwd: Path) -> None:
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True,
                            timeout=INSTALL_TIMEOUT_S)  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(f"{command}:\n{result.stdout}\n{result.stderr}")


if __name__ == "__main__":
    print(old_release())
