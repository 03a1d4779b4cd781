"""The rows the device engines reduce a tensor to, column by column, named.

A raw row (deferred.arena_stats and tensor_stats, blockstats.combine, the reference
deferred.exact_row) is what is read back from the device; deferred.from_raw makes it a
summary. The Triton kernel (blockkernel.py) writes a partial row per program, which
blockstats.combine merges into raw rows: the ``SUMMED`` columns by adding them up, the
others by code of their own. A module of its own: the kernel's module
imports Triton, blockstats.py must not, and both need the names.
"""

from __future__ import annotations

# the columns whose programs' values add up to the tensor's: blockstats.combine sums them
# with no code of their own (a new summable column goes at the end of these)
SUMMED = ("nan", "posinf", "neginf", "zeros", "abssum", "negatives")
# ``abssum``: the sum of |x|; ``negatives``: the values below 0, -inf among them; ``sat``:
# the values equal to the min or the max
RAW = ("min", "max", "sum", "m2", *SUMMED, "sat")
# a program's partial row: the raw row of its range, but for the values equal to its min
# and to its max apart, its element count, and its sum less the shift
PARTIAL = ("min", "max", "sum", "m2", *SUMMED, "at_min", "at_max", "count", "shifted")
