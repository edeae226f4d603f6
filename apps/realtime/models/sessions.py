"""Served sessions, their turns and their feedback (helper CONTROL fills this in)."""

__all__: list[str] = []
