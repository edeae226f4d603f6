"""Configurable, pure-Python rewards for agent trajectories (docs/methods.md section 3, Context-1 X2-X5).

`schema` holds the validated reward config (`RewardSpec`), `terms` the pure formulas and `score` the combination
of terms into one scalar reward per trajectory.
"""
