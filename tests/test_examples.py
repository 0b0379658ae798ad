"""Every script in examples/ runs to completion on its own generated data."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

#: 05_lightning.py runs three 2-process training jobs; tests/streaming/test_lightning.py runs it.
EXAMPLES = sorted(
    path
    for path in (pathlib.Path(__file__).parent.parent / "examples").glob("[0-9]*.py")
    if path.name != "05_lightning.py"
)


@pytest.mark.slow
@pytest.mark.parametrize("script", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_runs(script: pathlib.Path, tmp_path: pathlib.Path) -> None:
    env = {**os.environ, "SHARDSTREAM_EXAMPLE_DIR": str(tmp_path), "PYTHONWARNINGS": "error"}
    result = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=240,
    )
    assert result.returncode == 0, f"{script.name} failed:\n{result.stdout}\n{result.stderr}"
    assert result.stdout.strip(), f"{script.name} printed nothing"
