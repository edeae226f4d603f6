"""Writes for real-time RL, one module per seam: `sessions` (the session_turn ingest store, feedback), `serving`
(the launches of the serve, simulate and sessiontrain kinds, the A/B split, client key verification), `loops`
(the lead's: loops and their cycles). Import from the module: `from apps.realtime.services.serving import ...`."""
