"""``python -m megaphone`` runs the command-line interface."""

import sys

from megaphone.cli import main

sys.exit(main())
