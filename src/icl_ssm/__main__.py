"""``python -m icl_ssm``: the command line."""

import sys

from icl_ssm.cli import main

sys.exit(main())
