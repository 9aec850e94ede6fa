"""`python -m specdecode` is the `specdecode` command."""

import sys

from specdecode.cli import main

sys.exit(main())
