"""`python -m microbench`: see microbench/cli.py for the commands."""

import sys

from microbench.cli import main

sys.exit(main())
