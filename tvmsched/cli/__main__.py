"""`python -m tvmsched.cli`: the command line."""

import sys

from tvmsched.cli.main import main

sys.exit(main())
