"""Simulated users for the real-time RL loop (issue 18, section 6; the `simulate` job).

Each simulated user plays coding sessions against the serving endpoint through the official `openai` client, as an
editor plug-in would: the coding harness (`workers.coding.environment`) runs client-side on a repository task, the
agent's tool calls run in its workspace and sandbox, the hidden tests run at the end, and the user posts feedback
derived from them, with configurable noise and a configurable reward-hack opportunity (users who never complain
about a clarifying question).

- `users`: every seeded choice (task, user, tolerance of questions, noise) and the verdict;
- `harness`: the environment's conversation <-> Chat Completions messages, tools and tool calls;
- `feedback`: posting FeedbackIn events to the control plane, idempotent by event id;
- `session`: one session, end to end;
- `runner`: the simulation: sessions in flight, metrics, the per-session table, the summary.
"""
