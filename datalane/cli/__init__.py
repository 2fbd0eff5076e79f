"""The ``datalane`` command: one module per subcommand.

* ``run``     - one world in one process; prints ``step=<n> sha256=<global hash>`` per step
                (:mod:`datalane.cli.run`).
* ``verify``  - every world size x worker count, plus resumes on another topology; exits 0
                only if every step hash agrees (:mod:`datalane.cli.verify`).
* ``demo``    - the elastic demo with one OS process per rank (:mod:`datalane.cli.demo`).
* ``inspect`` - a resume point in human form (:mod:`datalane.cli.inspect`).
* ``audit``   - the ledger of a checkpoint store, hash chain (and, with ``--key``, the
                manifests' HMAC signatures) verified (:mod:`datalane.cli.audit`).

:mod:`datalane.cli.main` builds the parser from the modules' ``add`` functions and runs the
chosen one. Every refused input is one line on stderr naming the value, exit code 2; a command
whose extra is not installed says which one to install.
"""

from datalane.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
