import sys

from lab_helpers.cli import main

sys.exit(main())
