"""``python -m datalane.cli``: the ``datalane`` command."""

import sys

from datalane.cli.main import main

sys.exit(main())
