"""Placeholder package; see the open issues."""
