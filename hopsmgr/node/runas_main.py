"""Entry point of the privileged step: `python -m hopsmgr.node.runas_main` runs hopsmgr.node.runas.main
(a module of its own, so that running it does not import hopsmgr.node.runas twice)."""

from __future__ import annotations

import sys

from hopsmgr.node.runas import main

if __name__ == "__main__":
    sys.exit(main())
