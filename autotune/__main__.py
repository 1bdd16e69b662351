import sys

from autotune.ui.cli import main

sys.exit(main())
