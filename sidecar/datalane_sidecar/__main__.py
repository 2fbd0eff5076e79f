import sys

from datalane_sidecar.cli import main

sys.exit(main())
