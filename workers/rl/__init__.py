"""RL math for the execution plane: group advantages and policy losses (docs/methods.md section 4)."""
