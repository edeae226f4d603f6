"""The `crucible` CLI's exit codes and summary, against canned API replies (the e2e test runs it for real)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from controlplane import cli

DECIDED: dict[str, Any] = {
    "id": 4,
    "gate": 1,
    "gate_name": "ship",
    "checkpoint": 9,
    "status": "decided",
    "error": "",
    "candidate_evals": [
        {"id": 2, "benchmark": "humaneval", "benchmark_version": 1, "status": "succeeded", "metrics": {"pass@1": 0.5}}
    ],
    "baseline_evals": [],
    "decision": {
        "id": 7,
        "final_verdict": "pass",
        "approval": "",
        "evidence": {
            "outcomes": [
                {"index": 0, "rule": {"type": "threshold"}, "verdict": "pass", "message": "pass@1 = 0.5 >= 0.4 | ok"}
            ]
        },
    },
}


def _replying(monkeypatch, *replies: httpx.Response) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    calls: list[tuple[str, str]] = []
    queue = list(replies)

    def request(self, method, url, json=None):  # type: ignore[no-untyped-def]
        calls.append((method, str(url)))
        return queue.pop(0)

    monkeypatch.setattr(httpx.Client, "request", request)
    return calls


def _check(verdict: str) -> dict[str, Any]:
    return {**DECIDED, "decision": {**DECIDED["decision"], "final_verdict": verdict}}


@pytest.mark.parametrize(
    ("verdict", "flags", "code"),
    [("pass", [], 0), ("fail", [], 1), ("pending", [], 1), ("pending", ["--pending-ok"], 0)],
)
def test_gate_check_exit_codes_follow_the_decision(monkeypatch, capsys, verdict, flags, code) -> None:
    calls = _replying(monkeypatch, httpx.Response(200, json=_check(verdict)))
    argv = ["--token", "crk_x", "gate", "check", "--gate", "1", "--checkpoint", "9", *flags]
    assert cli.main(argv) == code
    assert calls == [("POST", "/api/v1/gates/1/evaluate/")]
    out = capsys.readouterr().out
    assert out.startswith("### Crucible gate `ship`") and "| 0 | threshold | pass | pass@1 = 0.5 >= 0.4 \\| ok |" in out


def test_gate_check_polls_a_waiting_check_until_it_is_decided(monkeypatch, tmp_path) -> None:
    waiting = {**DECIDED, "status": "waiting", "decision": None}
    calls = _replying(monkeypatch, httpx.Response(202, json=waiting), httpx.Response(200, json=_check("pass")))
    summary = tmp_path / "s.md"
    argv = [
        "--token",
        "t",
        "gate",
        "check",
        "--gate",
        "1",
        "--checkpoint",
        "9",
        "--poll",
        "0",
        "--markdown",
        str(summary),
    ]
    assert cli.main(argv) == 0
    assert calls[-1] == ("GET", "/api/v1/gate-checks/4/") and "✅ PASS" in summary.read_text()


@pytest.mark.parametrize(
    "reply",
    [
        httpx.Response(200, text="<html>login</html>"),  # a proxy or a login page: not an API answer
        httpx.Response(500, text="oops"),
        httpx.Response(400, json={"detail": "checkpoint: no checkpoint is registered at s3://x"}),
        httpx.Response(200, json={"unexpected": True}),
    ],
)
def test_anything_but_a_decision_is_an_infrastructure_error(monkeypatch, capsys, reply) -> None:
    _replying(monkeypatch, reply)
    assert cli.main(["--token", "t", "gate", "check", "--gate", "1", "--checkpoint", "9"]) == 2
    assert "crucible:" in capsys.readouterr().err


def test_an_errored_check_exits_2_and_no_token_exits_2(monkeypatch, capsys) -> None:
    _replying(monkeypatch, httpx.Response(200, json={**DECIDED, "status": "error", "error": "eval 2 failed: boom"}))
    assert cli.main(["--token", "t", "gate", "check", "--gate", "1", "--checkpoint", "9"]) == 2
    assert "ERROR" in capsys.readouterr().out
    assert cli.main(["--token", "", "gate", "check", "--gate", "1", "--checkpoint", "9"]) == 2
