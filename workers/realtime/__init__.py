"""Real-time RL (Composer 2, docs/methods.md section 2 "Real-time RL"): the records of served sessions and the feedback
users give on them, how feedback becomes a reward, and how recorded sessions become training samples.

The shapes every side shares live here (`records`): the serving job writes turns, the control plane stores them
with their feedback and freezes them into `session/v1` dataset rows, the session trainer and the re-scoring job
read those rows back. This package imports no Django (docs/architecture.md, "Boundaries that hold").
"""
