"""`python -m sparkbus.cli`: the `sparkbus` command."""
import sys

from . import main

sys.exit(main())
