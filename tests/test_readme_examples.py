"""Every README example marked ``<!-- runnable -->`` runs as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
READMES = [ROOT / "README.md", *sorted((ROOT / "packages").glob("*/README.md"))]
BLOCK = re.compile(r"<!-- runnable -->\s*\n```python\n(.*?)```", re.DOTALL)


def _examples() -> list[tuple[str, str]]:
    found = []
    for readme in READMES:
        for index, match in enumerate(BLOCK.finditer(readme.read_text())):
            found.append((f"{readme.parent.name}/{readme.name}#{index}", match.group(1)))
    return found


EXAMPLES = _examples()


def test_some_examples_are_marked_runnable() -> None:
    assert EXAMPLES


@pytest.mark.parametrize(("where", "code"), EXAMPLES, ids=[w for w, _ in EXAMPLES])
def test_readme_example_runs(where: str, code: str, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, f"{where} failed:\n{result.stdout}\n{result.stderr}"
