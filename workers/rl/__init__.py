"""RL math for the execution plane: group advantages and policy losses (methods.md section 4)."""
