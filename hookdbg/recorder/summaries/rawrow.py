"""The rows the device engines reduce a tensor to, column by column, named.

A raw row (deferred.arena_stats and tensor_stats, blockstats.combine, the reference
deferred.exact_row) is what is read back from the device; deferred.from_raw makes it a
summary. The Triton kernel (blockkernel.py) writes a partial row per program, which
blockstats.combine merges into raw rows. A module of its own: the kernel's module
imports Triton, blockstats.py must not, and both need the names.
"""

from __future__ import annotations

# ``sat``: the values equal to the min or the max
RAW = ("min", "max", "sum", "m2", "nan", "posinf", "neginf", "zeros", "sat")
# a program's partial row: the raw row of its range, but for the values equal to its min
# and to its max apart, its element count, and its sum less the shift
PARTIAL = (*RAW[:-1], "at_min", "at_max", "count", "shifted")
