"""Calls: what every hook shares about one module call.

The records (``calls``: ``Call``, ``Segment``, ``StepState``), the module names
(``naming``, ``labels``), the guard around hookdbg's own code (``envelope``), the hand-over
of rows to the writer (``handoff``), forwards run again in backward (``recompute``), the
tensors of a call's inputs and outputs (``tensors``) and the names the C path looks up
(``cboundary``). It imports only summaries/ (and alerts/ for types).
"""
