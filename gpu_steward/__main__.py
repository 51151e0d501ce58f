import sys

from gpu_steward import cli

sys.exit(cli.main())
