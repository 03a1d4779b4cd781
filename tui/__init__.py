"""The Textual app for replaying, searching and diffing recordings (installed as hookdbg.tui)."""
