"""Parallel text from openly licensed localisation packages (tools/build_parallel_corpus.py)."""
