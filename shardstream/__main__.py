"""``python -m shardstream``: the command line (the same as the ``shardstream`` command)."""

import sys

from shardstream._cli import main

sys.exit(main())
