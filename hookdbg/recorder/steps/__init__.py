"""Steps: where a training step or eval batch begins and ends, and what is settled then.

``steps`` (the step rule), ``segments`` (a segment's start and end: its rows, batches,
device times), ``steering`` (what to record at each step, as steered by ``hookdbg ctl``)
and ``meta`` (the run's metadata). Imports hooks/ and the rooms below it.
"""
