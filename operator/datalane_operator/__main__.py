"""``python -m datalane_operator``: the ``datalane-operator`` command."""

import sys

from datalane_operator.cli import main

sys.exit(main())
