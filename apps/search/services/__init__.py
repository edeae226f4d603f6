"""Writes for search: index builds (`indexes`), synthetic-task generation (`datagen`), and what the search
environment needs from the control plane before a run or benchmark may use it (`envs`)."""
