"""hookdbg read."""
