"""Real-time RL's rows: served sessions and their feedback (`sessions`), loops and their cycles (`loops`)."""

from apps.realtime.models.loops import Cycle, CyclePhase, CycleStatus, Loop
from apps.realtime.models.sessions import *  # noqa: F403  (the sessions module lists its models in __all__)

__all__ = ["Cycle", "CyclePhase", "CycleStatus", "Loop"]
