"""Registered when the app registry is ready (apps.common autodiscovers every app's `hooks` module): the run kinds
real-time RL owns (serve, simulate, sessiontrain; each launched through `POST /api/v1/runs/`), and the store of
the `session_turn` events serving runs report (apps.runs.services.ingest)."""

from __future__ import annotations

from apps.realtime.launches import (
    ServeLaunchSerializer,
    SessionTrainLaunchSerializer,
    SimulateLaunchSerializer,
    serve_launch_from_api,
    session_train_launch_from_api,
    simulate_launch_from_api,
)
from apps.realtime.services.serving import SERVE, SESSIONTRAIN, SIMULATE
from apps.realtime.services.sessions import session_turns_store
from apps.runs import kinds
from apps.runs.services import register_event_store
from workers.specs import ServeSpec, SessionTrainSpec, SimulateSpec

for kind, spec, launch_input, launch in (
    (SERVE, ServeSpec, ServeLaunchSerializer, serve_launch_from_api),
    (SIMULATE, SimulateSpec, SimulateLaunchSerializer, simulate_launch_from_api),
    (SESSIONTRAIN, SessionTrainSpec, SessionTrainLaunchSerializer, session_train_launch_from_api),
):
    kinds.register(
        kinds.RunKindHandler(kind=kind, app="realtime", job_spec=spec, launch_input=launch_input, launch=launch)
    )
register_event_store("session_turn", session_turns_store)
