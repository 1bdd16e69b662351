"""How people ask: the command line (`cli`, `commands/`), the Python API (`api`), the Ray dashboard."""
