"""README.md's and the guides' code blocks run as written, in order, on tiny local data: the docs
cannot drift.

The pages run in ``PAGES`` order (README first, then the guides in the order a reader meets
them), all in one session. Every ```python and ```bash block runs (in one process for the
Python ones, sharing names as a reader's session would; bash blocks through ``bash -euo
pipefail``), in a folder that holds what the examples name: ``data/train`` (an ImageFolder) and
``crawl/2026-11-2{4,5,6}``. A block is left out only with the line ``<!-- readme-test: not run
(REASON) -->`` just above it, where REASON is one of ``REASONS`` and the block must contain what
that reason needs (an ``s3://`` URL, ``init_process_group``...), so a marker cannot hide a block
that could run. Output blocks
(```text and unlabelled fences) are not code.

Two kinds of help, both listed here and checked to still apply: ``FASTER`` makes the same calls
with fewer workers and epochs, and ``SETUP`` supplies what README leaves to its reader (a
checkpoint to restore, a key list).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from tests.conftest import encode_image, write_image_folder

ROOT = pathlib.Path(__file__).parent.parent
#: Every page whose code runs, in order: later pages use what earlier ones built.
PAGES = [
    "README.md", "docs/guides/build.md", "docs/guides/own-shards.md", "docs/guides/growing.md",
    "docs/guides/cleaning.md", "docs/guides/streaming.md", "docs/guides/gpu.md",
    "docs/guides/pixels.md", "docs/guides/mixtures.md", "docs/guides/evaluation.md",
    "docs/guides/resume.md", "docs/guides/performance.md", "docs/guides/object-stores.md",
    "docs/development.md", "docs/api/index.md",
]  # fmt: skip
MARKER = re.compile(r"<!-- readme-test: not run \((?P<reason>[\w-]+)\) -->")

#: Why a block may be left out, and a pattern the block must match for that reason to hold.
REASONS = {
    "installs": r"pip install",  # the set-up commands, which CI runs in a fresh venv (.ci/run)
    "s3": r"s3://",
    "remote": r"https://example\.org",  # a placeholder host; tests/stores reads real servers
    "torchrun": r"init_process_group",
    "lightning": r"LightningModule|self\.log_dict",  # examples/05_lightning.py trains for real
    "accelerate": r"Accelerator\(\)",  # tests/streaming/test_accelerate.py runs it
}
#: torchdata's StatefulDataLoader calls a torch function that torch now deprecates.
TORCHDATA_WARNING = "ignore:'set_vital' is deprecated:UserWarning"
#: The same calls, made cheaper for a 2-core test machine: (README text, what runs instead).
FASTER = [
    ("num_workers=8", "num_workers=2"),
    ("workers=8", "workers=2"),
    ("--workers 8", "--workers 2"),
    ("range(90)", "range(2)"),
    ("pin_memory=True", "pin_memory=False"),  # no accelerator here: torch warns about pinning
]
#: What a block needs that README leaves to the reader: (a line of the block, code run first).
SETUP = [
    ('manifest = build_shards("data/train", "shards/train"',
     'import shutil; shutil.rmtree("shards/train")  # the CLI block built it with other limits'),
    ("--keys hard_keys.txt", "printf 'class_00/img_00000\\nclass_01/img_00004\\n' > hard_keys.txt"),
    ("shardstream dups shards/train shards/val  ",  # a val set holding one train image
     "mkdir -p val/class_01 && cp \"$(ls data/train/class_01/*.* | head -1)\" val/class_01/ "
     "&& shardstream build val shards/val -q"),
    ("attach shards/train scores.parquet",
     "python -c \"import pandas as pd; from shardstream import RandomAccessDataset; "
     "key = RandomAccessDataset('shards/train', decode='raw').raw(0)['__key__']; "
     "pd.DataFrame({'__key__': [key], "
     "'aesthetic': [6.0], 'nsfw': [False]}).to_parquet('scores.parquet')\""),  # a key it holds
    ("--keys takedown.txt", "printf 'class_00/img_00000\\n' > takedown.txt; echo 3 > bad.txt"),
    ('transform=train_transform, decode="cuda")',  # on a machine without CUDA: the CPU path
     "MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)\n"
     "model = lambda images: images.mean(dim=(2, 3))  # 3 channels: one score per class\n"
     "loss_fn = torch.nn.functional.cross_entropy"),
    ('build_shards("crawl/2026-11-26", "shards/crawl", append=True',
     'checkpoint = {"loader": StreamingDataLoader(StreamingDataset("shards/crawl", '
     'batch_size=256)).state_dict()}  # a state saved on version 2'),
]  # fmt: skip


def readme_blocks(text: str, page: str = "README.md") -> list[dict[str, object]]:
    """Every fenced block: language, code, where it starts (page and line), the reason it is not
    run (or None)."""
    blocks = []
    for match in re.finditer(r"^```(\w*)\n(.*?)^```$", text, flags=re.DOTALL | re.MULTILINE):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = MARKER.fullmatch(before.strip())
        blocks.append({
            "language": match.group(1), "code": match.group(2),
            "line": f"{page} line {text.count(chr(10), 0, match.start()) + 2}",
            "reason": marker["reason"] if marker else None,
        })  # fmt: skip
    return blocks


def _prepared(block: dict[str, object]) -> dict[str, object]:
    code = str(block["code"])
    for original, faster in FASTER:
        code = code.replace(original, faster)
    setup = [first for line, first in SETUP if line in str(block["code"])]
    return {**block, "code": "\n".join([*setup, code])}


_DRIVER = """
import json, subprocess, sys, traceback
namespace = {"__name__": "__readme__"}
for block in json.loads(sys.stdin.read()):
    where = block["line"]
    if block["language"] == "bash":
        result = subprocess.run(["bash", "-euo", "pipefail", "-c", block["code"]],
                                capture_output=True, text=True)
        if result.returncode:
            sys.exit(f"{where} (bash) failed:\\n{block['code']}\\n{result.stdout}{result.stderr}")
        continue
    try:
        exec(compile(block["code"], where, "exec"), namespace)
    except BaseException:
        sys.exit(f"{where} (python) failed:\\n{block['code']}\\n{traceback.format_exc()}")
print("ok")
"""


def _data(folder: pathlib.Path) -> None:
    """What README's examples name: an ImageFolder and three days of a crawl."""
    write_image_folder(folder / "data" / "train", num_classes=3, per_class=4)
    for number, day in enumerate(("2026-11-24", "2026-11-25", "2026-11-26")):
        for label in range(2):
            classes = folder / "crawl" / day / f"class_{label}"
            classes.mkdir(parents=True)
            for item in range(3):
                seed = 100 * number + 10 * label + item
                (classes / f"{day}-{item}.jpg").write_bytes(encode_image(24, 16, seed))


@pytest.mark.slow
def test_every_code_block_runs_or_says_why_not(tmp_path: pathlib.Path) -> None:
    blocks = [
        block for page in PAGES
        for block in readme_blocks((ROOT / page).read_text(encoding="utf-8"), page)
    ]  # fmt: skip
    code = [block for block in blocks if block["language"] in ("python", "bash")]
    for block in code:
        reason = block["reason"]
        if reason is not None:
            assert reason in REASONS, f"{block['line']}: unknown reason {reason!r}"
            assert re.search(REASONS[reason], str(block["code"])), (
                f"{block['line']}: marked not run ({reason}) but has no {REASONS[reason]!r}: run it"
            )
    runs = [_prepared(block) for block in code if block["reason"] is None]
    for block in runs:  # checked before anything runs: a block that installs is never run here
        needs = [reason for reason, pattern in REASONS.items() if re.search(pattern, block["code"])]
        assert not needs, f"{block['line']}: mark it not run ({needs[0]})"
    for line, _ in SETUP:  # each setup still belongs to a block that runs
        assert sum(line in str(block["code"]) for block in runs) == 1, line
    assert sum(block["language"] == "python" for block in runs) >= 4
    _data(tmp_path)
    env = {**os.environ, "PATH": f"{pathlib.Path(sys.executable).parent}:{os.environ['PATH']}",
           "PYTHONWARNINGS": f"error,{TORCHDATA_WARNING}"}  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-c", _DRIVER], input=json.dumps(runs), cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-6000:]


def test_every_page_with_code_is_run() -> None:
    """A new guide with code must join ``PAGES``: its blocks would otherwise go untested."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    with_code = {
        str(page.relative_to(ROOT)) for page in pages
        if any(b["language"] in ("python", "bash") for b in readme_blocks(page.read_text()))
    }  # fmt: skip
    assert with_code <= set(PAGES), sorted(with_code - set(PAGES))
