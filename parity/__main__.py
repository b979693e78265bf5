"""`python -m parity ...`: the same as the `parity` console script."""

import sys

from parity.cli import main

sys.exit(main())
