"""Hooks: the per-call hooks torch runs, and what they measure.

``modulehooks`` (forward pre-hook and hook on every module call), ``observe`` (a call's
tensors summarised and checked), ``gradients`` and ``backward`` (backward passes),
``optimizer`` and ``gradscaler`` (optimizer steps, GradScaler), ``timing`` and
``devicetime`` (host and device times), ``compiled`` (torch.compile), ``elsewhere``
(other threads and processes), ``recursion`` (room under the recursion limit),
``hookset`` (one owner of every handle) and ``shared`` (what they share, made once by
core.py). Imports alerts/, calls/, summaries/.
"""
