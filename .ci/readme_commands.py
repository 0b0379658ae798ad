"""Print the set-up commands of README.md, one per line, exactly as a reader would copy them.

They are the fenced ``bash`` blocks of the "Set up on a fresh machine" section; CI runs each one
in a fresh virtual environment, so the README cannot drift from what actually works.
"""

from __future__ import annotations

import re
import sys

SECTION = "## Set up on a fresh machine"


def setup_commands(text: str) -> list[str]:
    """The commands of the set-up section's ```bash blocks (continuation lines joined)."""
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    section = text[start : end if end >= 0 else len(text)]
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.DOTALL)
    return [" ".join(block.replace("\\\n", " ").split()) for block in blocks]


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as readme:
        print("\n".join(setup_commands(readme.read())))
