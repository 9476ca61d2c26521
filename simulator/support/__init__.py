"""Plumbing every room uses: YAML with line numbers, atomic files, output folders, preset paths, the GC pause, size
limits."""
