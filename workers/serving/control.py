"""What the serving job asks the control plane, over HTTP with the run's own ingest token.

- `GET <control_url>target/`: what to serve (`Target`): arms with their weight and checkpoint, and a revision that
  changes whenever anything in it changes. Read by the controller loop every `poll_seconds`.
- `POST <control_url>keys/verify/` `{"key": ...}`: whether a client's bearer key may call this endpoint
  (`KeyVerifier`, in the router, with a TTL cache so a request costs a dictionary lookup, not a round trip).

The arm of a session is a pure function of its id and the weights (`pick_arm`): sha256 of the session id read as
a number in [0, 1), against the arms' cumulative normalised weights, so a session stays on its arm for as long as
the split does not change, whichever router replica handles it.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field

from workers.serving.openai_request import APIError

ARM_NAME_PATTERN = r"^[A-Za-z0-9_-]{1,16}$"


class TargetArm(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str = Field(pattern=ARM_NAME_PATTERN)
    weight: float = Field(ge=0.0, allow_inf_nan=False)
    deployment_id: int | None = None
    checkpoint_id: int | None = Field(default=None, ge=1)
    checkpoint_uri: str | None = None

    @property
    def policy_version(self) -> int:
        """The version a response served by this arm carries: the checkpoint id, 0 for the base model."""
        return self.checkpoint_id or 0

    @property
    def weights_key(self) -> tuple[int | None, str | None]:
        """What decides the weights: a change of it is a hot swap."""
        return (self.checkpoint_id, self.checkpoint_uri if self.checkpoint_id else None)


class Target(BaseModel):
    """The body of `GET <control_url>target/`."""

    model_config = ConfigDict(extra="ignore")

    revision: str
    model_name: str = ""
    arms: list[TargetArm] = Field(default_factory=list)

    def check(self) -> Target:
        names = [arm.name for arm in self.arms]
        if len(set(names)) != len(names):
            raise ValueError(f"arm names repeat: {names}")
        for arm in self.arms:
            if arm.checkpoint_id is not None and not arm.checkpoint_uri:
                raise ValueError(f"arm {arm.name!r} names checkpoint {arm.checkpoint_id} without its checkpoint_uri")
        if self.arms and sum(arm.weight for arm in self.arms) <= 0:
            raise ValueError("the arms' weights add up to 0")
        return self


def session_point(session_id: str) -> float:
    """sha256 of the session id as a number in [0, 1)."""
    digest = hashlib.sha256(session_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def pick_arm(session_id: str, arms: Sequence[tuple[str, float]]) -> str:
    """The arm of a session: its `session_point` against the cumulative normalised weights of `arms` (name,
    weight), in the order given. Raises ValueError when there is no arm with a positive weight."""
    total = sum(weight for _, weight in arms if weight > 0)
    if total <= 0:
        raise ValueError("no arm with a positive weight")
    point = session_point(session_id) * total
    running = 0.0
    last = ""
    for name, weight in arms:
        if weight <= 0:
            continue
        running += weight
        last = name
        if point < running:
            return name
    return last  # rounding at the top end


def fetch_target(client: httpx.Client, control_url: str, token: str) -> Target:
    """The current target; raises httpx.HTTPError or ValueError (with the reason) when it cannot be had."""
    response = client.get(control_url + "target/", headers={"Authorization": f"Bearer {token}"})
    if response.status_code != 200:
        raise ValueError(f"GET {control_url}target/ answered {response.status_code}: {response.text[:300]}")
    return Target.model_validate_json(response.content).check()


@dataclass(frozen=True)
class Caller:
    """Who a verified key belongs to: the ApiToken id (None for a simulate run's token) and the user's name."""

    token_id: int | None
    user: str


class KeyVerifier:
    """Checks clients' bearer keys with the control plane, trusting an answer for `ttl` seconds.

    Refusals are cached too (a client hammering with a bad key costs one call per `ttl`). When the control plane
    cannot answer, a key verified before stays trusted (even past its `ttl`) and an unknown key gets a 503.
    Keys are cached by their sha256, never in clear."""

    def __init__(
        self,
        control_url: str,
        token: str,
        ttl: float,
        *,
        client: httpx.AsyncClient | None = None,
        max_entries: int = 10_000,
        timeout: float = 10.0,
    ) -> None:
        self.url = control_url + "keys/verify/"
        self.ttl = ttl
        self._headers = {"Authorization": f"Bearer {token}"}
        self._client = client or httpx.AsyncClient(timeout=timeout)
        self._cache: OrderedDict[str, tuple[float, Caller | APIError]] = OrderedDict()
        self._max = max_entries
        self.calls = 0

    @staticmethod
    def bearer(authorization: str | None) -> str:
        """The key in an Authorization header; 401 when there is none."""
        if not authorization:
            raise APIError(
                401,
                "missing API key: send it as 'Authorization: Bearer <key>'",
                code="invalid_api_key",
            )
        scheme, _, key = authorization.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise APIError(401, "the Authorization header must be 'Bearer <key>'", code="invalid_api_key")
        return key.strip()

    async def verify(self, authorization: str | None) -> Caller:
        key = self.bearer(authorization)
        digest = hashlib.sha256(key.encode()).hexdigest()
        now = time.monotonic()
        cached = self._cache.get(digest)
        if cached is not None and now - cached[0] < self.ttl:
            return self._answer(cached[1])
        try:
            answer = await self._ask(key)
        except (httpx.HTTPError, ValueError) as exc:
            if cached is not None and isinstance(cached[1], Caller):
                return cached[1]
            raise APIError(
                503,
                f"the API key could not be verified now ({exc}); try again",
                type="server_error",
                code="unavailable",
            )
        if self.ttl > 0:
            self._cache[digest] = (now, answer)
            self._cache.move_to_end(digest)
            while len(self._cache) > self._max:
                self._cache.popitem(last=False)
        return self._answer(answer)

    @staticmethod
    def _answer(answer: Caller | APIError) -> Caller:
        if isinstance(answer, APIError):
            # A fresh copy per refusal: raising the cached one would chain every refused request's frames onto it.
            raise APIError.from_dict(answer.as_dict())
        return answer

    async def _ask(self, key: str) -> Caller | APIError:
        self.calls += 1
        response = await self._client.post(self.url, json={"key": key}, headers=self._headers)
        if response.status_code != 200:
            raise ValueError(f"keys/verify answered {response.status_code}")
        data: dict[str, Any] = response.json()
        if data.get("valid") is True:
            token_id = data.get("token_id")
            return Caller(token_id=int(token_id) if token_id is not None else None, user=str(data.get("user", "")))
        status = int(data.get("status", 401))
        reason = str(data.get("reason") or "invalid API key")
        if status == 403:
            return APIError(403, reason, type="permission_error", code="insufficient_scope")
        return APIError(401, reason, code="invalid_api_key")

    async def aclose(self) -> None:
        await self._client.aclose()
