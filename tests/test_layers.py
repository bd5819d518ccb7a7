"""collab's layers point one way and nothing in it imports in a cycle
(docs/architecture.md#a-layers): import-linter's contracts in pyproject.toml, run over
the code as it is, and over a copy with an upward import or a cycle added, which must fail."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT = Path(sys.executable).parent / "lint-imports"


def lint(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}  # the package of `tree`, not the installed one
    return subprocess.run(
        [str(LINT), "--no-cache"], cwd=tree, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def test_the_contracts_hold() -> None:
    result = lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("KEPT") == 3  # layers, early requests private, no cycle


@pytest.mark.parametrize(
    ("module", "added", "broken"),
    [
        # a model importing the socket's consumer: an upward import
        ("collab/chat/models.py", "from collab.chat import consumers", "collab.chat.models is not allowed to import"),
        # the layer of services importing the reply pipeline above it
        ("collab/chat/services/rooms.py", "from collab.chat.replies import jobs", "is not allowed to import"),
        # two modules of one layer importing each other (again.py imports jobs.py)
        ("collab/chat/replies/jobs.py", "from collab.chat.replies import again", "No cycles are allowed"),
        # a view reaching into the pipeline's private early requests
        ("collab/chat/views.py", "from collab.chat.replies import early", "Illegal imports of protected"),
    ],
)
def test_an_upward_import_or_a_cycle_fails_the_check(tmp_path: Path, module: str, added: str, broken: str) -> None:
    shutil.copytree(ROOT / "collab", tmp_path / "collab", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    target = tmp_path / module
    target.write_text(target.read_text() + f"\n{added}  # noqa\n")
    result = lint(tmp_path)
    assert result.returncode != 0
    assert broken in result.stdout, result.stdout
