"""``python -m gefen_conformance.cli``: the ``gefen-conformance`` command."""

import sys

from gefen_conformance.cli.command import main

sys.exit(main())
