"""`python -m refmodel`: see refmodel/cli.py."""

import sys

from refmodel.cli import main

sys.exit(main())
