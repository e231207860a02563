"""`python -m vlserve ...` is the `vlserve` command."""

import sys

from vlserve.cli import main

sys.exit(main())
