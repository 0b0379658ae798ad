"""Every script in examples/ runs to completion on its own generated data."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

#: 05_lightning.py runs four 2-process jobs; tests/streaming/test_lightning.py runs it.
EXAMPLES = sorted(
    path
    for path in (pathlib.Path(__file__).parent.parent / "examples").glob("[0-9]*.py")
    if path.name != "05_lightning.py"
)


#: What an example that checks itself prints when its checks pass (it asserts before printing):
#: exact evaluation on 4 torchrun ranks and in Lightning on 2, and a checked torchrun resume.
PRINTS = {
    "07_exact_eval.py": "4 ranks, mask: 1001 samples, accuracy",
    "08_lightning_eval.py": "Lightning validate on 2 ranks: 1001 samples, accuracy",
    "09_checked_resume.py": "every rank stops: ResumeError: the loader is at epoch 0, batch 0",
}


@pytest.mark.slow
@pytest.mark.parametrize("script", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_runs(script: pathlib.Path, tmp_path: pathlib.Path) -> None:
    env = {**os.environ, "SHARDSTREAM_EXAMPLE_DIR": str(tmp_path), "PYTHONWARNINGS": "error"}
    result = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, f"{script.name} failed:\n{result.stdout}\n{result.stderr}"
    assert result.stdout.strip(), f"{script.name} printed nothing"
    assert PRINTS.get(script.name, "") in result.stdout, result.stdout
