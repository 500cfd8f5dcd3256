"""Command-line tools: `python -m rawgrad.tools.profile TRACE`, `python -m rawgrad.tools.compare_torch`."""
