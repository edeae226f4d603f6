from __future__ import annotations

import time

import pytest
from django.core.management.base import CommandError
from django.test import TransactionTestCase
from rest_framework.test import APIClient

from apps.accounts.models import Role, User
from apps.accounts.services import api_token_create
from apps.web.demo import demo_trajectories


@pytest.fixture
def make_user(db):  # type: ignore[no-untyped-def]
    def make(role: str = Role.OPERATOR, username: str | None = None) -> User:
        user = User.objects.create_user(username=username or f"{role}-user", password="pw-123456", role=role)
        return user

    return make


@pytest.fixture
def users(make_user):  # type: ignore[no-untyped-def]
    return {role: make_user(role) for role in Role.values}


@pytest.fixture
def client_for(users):  # type: ignore[no-untyped-def]
    """An API client authenticated with a bearer token holding all of the role's capabilities."""

    clients: dict[str, APIClient] = {}

    def make(role: str) -> APIClient:
        if role in clients:
            return clients[role]
        user = users[role]
        _, secret = api_token_create(user=user, name=f"test-{role}", scopes=sorted(user.capabilities))
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
        clients[role] = client
        return client

    return make


@pytest.fixture
def trajectories_jsonl() -> bytes:
    return demo_trajectories(count=40, seed=3)


@pytest.fixture(scope="session", autouse=True)
def _flush_retries_a_deadlock():  # type: ignore[no-untyped-def]
    """A transactional test's teardown empties every table with one TRUNCATE. In the end-to-end tests a process of
    the stack (an ingest from a job that is still closing, a beat tick) can hold a lock that TRUNCATE needs while
    waiting for one TRUNCATE holds, and PostgreSQL picks the flush as the deadlock victim (CI, stop 34). The flush
    is retried a few times after a pause; a flush that keeps failing still fails the test."""
    teardown = TransactionTestCase._fixture_teardown

    def retried(self):  # type: ignore[no-untyped-def]
        for attempt in range(4):
            try:
                return teardown(self)
            except CommandError:
                if attempt == 3:
                    raise
                time.sleep(2.0 * (attempt + 1))
        return None

    TransactionTestCase._fixture_teardown = retried  # type: ignore[method-assign]
    yield
    TransactionTestCase._fixture_teardown = teardown  # type: ignore[method-assign]


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):  # type: ignore[no-untyped-def]
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def run(users, trajectories_jsonl):  # type: ignore[no-untyped-def]
    """A re-scoring run launched through the service (its dispatch waits for a commit that never comes)."""
    from apps.training.services import run_launch_rescore
    from tests.factories import context1_version, trajectories_version

    owner = users["operator"]
    return run_launch_rescore(
        created_by=owner,
        dataset_version=trajectories_version(owner=owner, data=trajectories_jsonl),
        reward_version=context1_version(owner=owner),
    )
