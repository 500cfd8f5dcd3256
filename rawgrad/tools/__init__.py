"""Command-line tools: `python -m rawgrad.tools.profile TRACE`."""
