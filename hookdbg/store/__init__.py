"""hookdbg store."""
