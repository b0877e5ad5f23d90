import sys

from icl_ssm.cli import main

sys.exit(main())
