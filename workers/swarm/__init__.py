"""Kimi K2.5's Agent Swarm (docs/methods.md section 1): wide-search tables and their scores (`table`, `wide`), frozen
sub-agents run in parallel (`subagents`) and the PARL accounting of critical steps (`critical`)."""
