"""``python -m elelem``: the same command line as the ``elelem`` script."""
from .cli import main

raise SystemExit(main())
