"""``python -m shardstream.cli``: the command line."""

import sys

from shardstream.cli import main

sys.exit(main())
