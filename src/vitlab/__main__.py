"""`python -m vitlab ...` (and `torchrun -m vitlab ...`) run the CLI."""

import sys

from vitlab.cli import main

sys.exit(main())
