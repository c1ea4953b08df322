"""``python -m pyg_sar.cli``: the ``pyg-sar`` command."""
import sys

from pyg_sar.cli.main import main

sys.exit(main())
