"""``python -m lab_helpers``."""

import sys

from lab_helpers.cli import main

sys.exit(main())
