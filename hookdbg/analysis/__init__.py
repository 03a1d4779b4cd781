"""hookdbg analysis."""
