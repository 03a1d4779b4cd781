"""Summaries: a tensor reduced to the numbers a row stores, and the engines that do it.

``stats`` (one pass on the host, with the optional C extension ``_cstats``), ``deferred``
(on the device, read back a step later), ``blockstats``/``blockkernel`` (Triton kernels
for large tensors, ``rawrow`` their columns), ``histograms``/``blockhist``/``histkernel``
(value histograms) and ``shards`` (a DTensor's local shard). Nothing here knows of module
calls: the other rooms of the recorder use it, it uses none of them.
"""
