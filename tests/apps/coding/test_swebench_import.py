"""SWE-bench / SWE-Gym instances imported as published (workers.coding.swebench): a bundle of `tasks.jsonl`
instance rows and the repository as a git bundle becomes verified repository tasks; a malformed instance is
refused naming its line and field, with nothing stored."""

from __future__ import annotations

import io
import json
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from apps.datasets.models import Dataset, DatasetVersion
from workers.coding.bundle import BundleError, parse_upload

pytestmark = pytest.mark.django_db

BUGGY = "def clamp(x, lo, hi):\n    return max(lo, x)\n"
TESTS_BEFORE = "from mathx import clamp\n\n\ndef test_inside():\n    assert clamp(2, 0, 3) == 2\n"
TESTS_AFTER = TESTS_BEFORE + "\n\ndef test_upper():\n    assert clamp(5, 0, 3) == 3\n"


def git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@x", "GIT_COMMITTER_NAME": "a", "GIT_COMMITTER_EMAIL": "a@x"}
    done = subprocess.run(["git", *args], cwd=repo, env={**env, "PATH": "/usr/bin:/bin", "HOME": str(repo)},
                          capture_output=True, text=True, check=True)  # fmt: skip
    return done.stdout


@pytest.fixture(scope="module")
def instance(tmp_path_factory) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    return make_instance(tmp_path_factory.mktemp("mathx"))


def make_instance(repo: Path) -> dict[str, Any]:
    """A repository with history, as SWE-bench sees one: the base commit, then the fix and its tests; the
    instance row and the git bundle of the repository."""
    git(repo, "init", "-q", "-b", "main")
    (repo / "mathx.py").write_text(BUGGY)
    (repo / "tests").mkdir()
    (repo / "tests" / "test_clamp.py").write_text(TESTS_BEFORE)
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "clamp")
    base = git(repo, "rev-parse", "HEAD").strip()
    (repo / "mathx.py").write_text("def clamp(x, lo, hi):\n    return max(lo, min(x, hi))\n")
    patch = git(repo, "diff", "--", "mathx.py")
    (repo / "tests" / "test_clamp.py").write_text(TESTS_AFTER)
    test_patch = git(repo, "diff", "--", "tests")
    git(repo, "commit", "-q", "-am", "fix the upper bound")
    git(repo, "bundle", "create", "-q", "../acme__mathx.bundle", "--all")
    row = {
        "instance_id": "acme__mathx-1",
        "repo": "acme/mathx",
        "base_commit": base,
        "patch": patch,
        "test_patch": test_patch,
        "problem_statement": "clamp() lets values above the maximum through.",
        "hints_text": "",
        "created_at": "2026-01-02T00:00:00Z",
        "FAIL_TO_PASS": json.dumps(["tests/test_clamp.py::test_upper"]),  # as the Hugging Face export holds it
        "PASS_TO_PASS": json.dumps(["tests/test_clamp.py::test_inside"]),
    }
    return {"row": row, "bundle": (repo.parent / "acme__mathx.bundle").read_bytes()}


def upload(rows: list[dict[str, Any]], bundle: bytes | None, name: str = "repos/acme__mathx.bundle") -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("tasks.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
        if bundle is not None:
            archive.writestr(name, bundle)
    return buffer.getvalue()


def test_an_instance_becomes_a_task_at_its_base_commit_with_the_test_patch_as_hidden_tests(instance) -> None:  # type: ignore[no-untyped-def]
    [imported] = parse_upload(upload([instance["row"]], instance["bundle"]))
    task = imported.task
    assert task.id == "acme__mathx-1" and task.instruction.startswith("clamp() lets values")
    assert imported.files == {"mathx.py": BUGGY.encode(), "tests/test_clamp.py": TESTS_BEFORE.encode()}
    assert task.hidden_tests.files == {"tests/test_clamp.py": TESTS_AFTER}
    assert task.hidden_tests.fail_to_pass == ["tests/test_clamp.py::test_upper"]
    assert task.hidden_tests.pass_to_pass == ["tests/test_clamp.py::test_inside"]
    assert task.reference_patch == instance["row"]["patch"]
    assert task.provenance["ids"]["instance_id"] == "acme__mathx-1" and task.source["kind"] == "swe-bench"
    assert task.source["created_at"] == "2026-01-02T00:00:00Z"


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"base_commit": "0" * 40}, "line 1: base_commit 0000000000000000000000000000000000000000 could not be read"),
        ({"base_commit": "main; rm -rf /"}, "line 1: field 'base_commit' must be a commit hash"),
        ({"FAIL_TO_PASS": "[not json"}, "line 1: field 'FAIL_TO_PASS' is a string but not a JSON list"),
        ({"test_patch": "--- a/nope.py\n+++ b/nope.py\n@@ -1 +1 @@\n-a\n+b\n"}, "field 'test_patch' does not apply"),
        ({"repo": "acme/other"}, "line 1: the upload has no repos/acme__other.bundle for repo 'acme/other'"),
        ({"problem_statement": ""}, "line 1: field 'problem_statement' must be a non-empty string"),
    ],
)
def test_a_malformed_instance_is_refused_naming_the_line_and_field(instance, change, expected) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(BundleError) as caught:
        parse_upload(upload([{**instance["row"], **change}], instance["bundle"]))
    assert any(expected in problem for problem in caught.value.problems), caught.value.problems


def test_an_instance_without_its_repository_says_how_to_bundle_it(instance) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(BundleError, match="git bundle create repos/acme__mathx.bundle --all"):
        parse_upload(json.dumps(instance["row"]).encode() + b"\n")
    with pytest.raises(BundleError, match="the upload has no repos/acme__mathx.bundle"):
        parse_upload(upload([instance["row"]], None))


def test_the_api_refuses_a_bad_instance_with_a_400_and_stores_nothing(instance, client_for) -> None:  # type: ignore[no-untyped-def]
    before = (Dataset.objects.count(), DatasetVersion.objects.count())
    body = {
        "target_dataset": "swe",
        "file": io.BytesIO(upload([{**instance["row"], "base_commit": "f" * 40}], instance["bundle"])),
    }
    body["file"].name = "swe.zip"
    response = client_for("operator").post("/api/v1/repo-tasks/import/", body, format="multipart")
    assert response.status_code == 400 and "could not be read from repos/acme__mathx.bundle" in json.dumps(
        response.json()
    )
    assert (Dataset.objects.count(), DatasetVersion.objects.count()) == before


def test_manage_py_verifies_the_instance_in_the_sandbox_and_stores_it(instance, users, tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "swe.zip"
    path.write_bytes(upload([instance["row"]], instance["bundle"]))
    out = io.StringIO()
    call_command("import_repo_tasks", str(path), "--dataset", "swe-tasks", "--owner", "operator-user", stdout=out)
    assert '"kept": 1' in out.getvalue(), out.getvalue()
    version = DatasetVersion.objects.get(dataset__name="swe-tasks")
    with version.file.open("rb") as handle:
        [stored] = [json.loads(line) for line in handle.read().splitlines()]
    assert stored["id"] == "acme__mathx-1" and stored["hidden_tests"]["fail_to_pass"] == [
        "tests/test_clamp.py::test_upper"
    ]
    # The fix made no difference to the tests it should fix: refused in the sandbox, nothing more stored.
    vacuous = {
        **instance["row"],
        "instance_id": "acme__mathx-2",
        "FAIL_TO_PASS": '["tests/test_clamp.py::test_inside"]',
        "PASS_TO_PASS": "[]",
    }
    path.write_bytes(upload([vacuous], instance["bundle"]))
    with pytest.raises(CommandError):
        call_command(
            "import_repo_tasks", str(path), "--dataset", "swe-tasks", "--owner", "operator-user", stdout=io.StringIO()
        )
    assert DatasetVersion.objects.filter(dataset__name="swe-tasks").count() == 1
