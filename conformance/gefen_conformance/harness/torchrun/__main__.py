"""``python -m gefen_conformance.harness.torchrun``: one rank of a torchrun certification."""

import sys

from gefen_conformance.harness.torchrun.entry import main

sys.exit(main())
