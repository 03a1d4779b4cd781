"""Alerts: NaN/inf origins and what is done about them.

``alert`` (what an alert says), ``nonfinite`` (where a non-finite value was born),
``capture`` (``--capture`` and the flight recorder's last tensors) and ``actions``
(warn, break, raise, stop). Imports calls/ and summaries/.
"""
