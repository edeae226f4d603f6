"""Worker-side code: Ray jobs, reward scoring and trajectory parsing.

Nothing here imports Django or the control plane, so the same code runs inside Ray tasks and in tests without
a database.
"""
