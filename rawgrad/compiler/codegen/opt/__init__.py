"""Kernel optimizations: the Opt definitions and their application (kernel.py), the default choice of opts
(heuristic.py), and the search for better ones (search.py)."""
