"""Recipes: experiments built on vepo_mcore that live in the checkout beside tools/ (never imported by
the library). recipes/toy is the whole chain on 2 CPU cores (tools/run_toy.py, tools/run_grid.py)."""
