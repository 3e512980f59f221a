"""``python -m server`` runs the CLI."""

import sys

from server.cli import main

sys.exit(main())
