"""`crucible`: the command-line client of Crucible's REST API, for CI and scripts.

It needs only a URL and an API token (create one on the Tokens API or in the admin):

    export CRUCIBLE_URL=http://127.0.0.1:8000 CRUCIBLE_TOKEN=crk_...
    crucible gate check --gate ship --checkpoint 12          # exit 0 pass, 1 fail, 2 infrastructure error
    crucible gate check --gate ship --checkpoint-uri s3://.../step-000100.pt --markdown summary.md
    crucible gate approve 7 --note "canary looks fine"        # needs the approve permission
    crucible gate rollback --gate ship
    crucible eval run --benchmark-version 3 --base-model smollm2-135m-instruct --wait
    crucible api GET /api/v1/runs/?kind=train                # any endpoint, JSON out

`gate check` starts (or reuses) the gate's evals for the checkpoint, waits for the decision and prints a
Markdown summary fit for a pull-request comment. Exit codes: 0 when the gate passes; 1 when a rule fails, an
approver rejects, or the decision still awaits an approver (`--pending-ok` makes that 0, `--wait-approval` waits
for the human); 2 on an infrastructure error (the server unreachable, a refused request, an eval that crashed, a
timeout, anything unexpected). The client depends on httpx and the standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import httpx

EXIT_PASS, EXIT_FAIL, EXIT_ERROR = 0, 1, 2


class CliError(Exception):
    """An infrastructure problem: printed to stderr, exit code 2."""


class Client:
    def __init__(self, url: str, token: str, timeout: float = 30.0) -> None:
        if not token:
            raise CliError("no API token: set CRUCIBLE_TOKEN or pass --token (create one at /api/v1/tokens/)")
        self.url = url.rstrip("/")
        self.http = httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=timeout, follow_redirects=True
        )

    def request(self, method: str, path: str, body: Any = None, ok: tuple[int, ...] = (200, 201, 202)) -> Any:
        try:
            reply = self.http.request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise CliError(f"cannot reach Crucible at {self.url}: {exc}") from exc
        if reply.status_code not in ok:
            try:
                detail = reply.json().get("detail", reply.text)
            except ValueError:
                detail = reply.text[:500]
            raise CliError(f"{method} {path} answered {reply.status_code}: {detail}")
        try:
            return reply.json() if reply.content else None
        except ValueError:
            raise CliError(f"{method} {path} answered {reply.status_code} with no JSON (a proxy or login page?)")

    def gate_id(self, gate: str) -> int:
        if gate.isdigit():
            return int(gate)
        found = self.request("GET", f"/api/v1/gates/?name={gate}")
        rows = found.get("results", found) if isinstance(found, dict) else found
        for row in rows:
            if row["name"] == gate:
                return int(row["id"])
        raise CliError(f"no gate named {gate!r}")


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


VERDICT_MARK = {"pass": "✅ PASS", "fail": "❌ FAIL", "pending": "⏳ PENDING APPROVAL"}


def markdown_summary(check: dict[str, Any], url: str) -> str:
    """A pull-request comment: the verdict, each rule's verdict and reason, and the evals behind them."""
    decision = check.get("decision") or {}
    gate = check.get("gate_name", check.get("gate"))
    if check.get("status") == "error":
        head = f"### Crucible gate `{gate}`: ⚠️ ERROR\n\n{check.get('error', '')}\n"
    else:
        verdict = decision.get("final_verdict", "pending")
        head = f"### Crucible gate `{gate}`: {VERDICT_MARK.get(verdict, verdict)}\n"
    lines = [
        head,
        f"Checkpoint {check.get('checkpoint')} · gate check {check.get('id')}"
        + (f" · [decision {decision['id']}]({url}/gates/decisions/{decision['id']}/)" if decision else ""),
        "",
    ]
    outcomes = (decision.get("evidence") or {}).get("outcomes") or []
    if outcomes:
        lines += ["| # | rule | verdict | reason |", "|---|---|---|---|"]
        for outcome in outcomes:
            reason = str(outcome.get("message", "")).replace("|", "\\|").replace("\n", " ")
            lines.append(f"| {outcome['index']} | {outcome['rule']['type']} | {outcome['verdict']} | {reason} |")
        lines.append("")
    evals = check.get("candidate_evals") or []
    if evals:
        lines.append("Evals of the candidate:")
        for ev in evals:
            metrics = ", ".join(f"{k} {_fmt(v)}" for k, v in sorted((ev.get("metrics") or {}).items()))
            lines.append(
                f"- {ev['benchmark']} (version {ev['benchmark_version']}), eval {ev['id']}: {metrics or ev['status']}"
            )
    if decision.get("approval"):
        lines.append(
            f"\n{decision['approval'].capitalize()} by {decision.get('approved_by')} at {decision.get('approved_at')}."
        )
    return "\n".join(lines) + "\n"


def _progress(check: dict[str, Any]) -> str:
    parts = []
    for ev in (check.get("candidate_evals") or []) + (check.get("baseline_evals") or []):
        parts.append(f"eval {ev['id']} {ev['status']} {ev.get('progress_done', 0)}/{ev.get('progress_total', 0)}")
    return "; ".join(parts)


def gate_check(client: Client, args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"benchmark_versions": args.benchmark_version or []}
    if args.checkpoint_uri:
        body["checkpoint_uri"] = args.checkpoint_uri
    else:
        body["checkpoint"] = args.checkpoint
    check = client.request("POST", f"/api/v1/gates/{client.gate_id(args.gate)}/evaluate/", body)
    deadline = time.monotonic() + args.timeout
    last = ""
    while check["status"] == "waiting" or (
        args.wait_approval and check["status"] == "decided" and check["decision"]["final_verdict"] == "pending"
    ):
        if time.monotonic() > deadline:
            raise CliError(f"gate check {check['id']} not decided after {args.timeout:.0f} s ({_progress(check)})")
        now = _progress(check)
        if now != last:
            print(f"waiting: {now}", file=sys.stderr, flush=True)
            last = now
        time.sleep(args.poll)
        check = client.request("GET", f"/api/v1/gate-checks/{check['id']}/")
    summary = markdown_summary(check, client.url)
    print(summary)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as handle:
            handle.write(summary)
    if check["status"] == "error":
        return EXIT_ERROR
    verdict = check["decision"]["final_verdict"]
    if verdict == "pending":
        print("the rules pass; the decision awaits an approver", file=sys.stderr)
        return EXIT_PASS if args.pending_ok else EXIT_FAIL
    return EXIT_FAIL if verdict == "fail" else EXIT_PASS


def gate_judge(client: Client, args: argparse.Namespace) -> int:
    verb = "approve" if args.command == "approve" else "reject"
    decision = client.request("POST", f"/api/v1/gate-decisions/{args.decision}/{verb}/", {"note": args.note})
    print(
        f"decision {decision['id']}: {decision['approval']} by {decision['approved_by']}; "
        f"verdict {decision['final_verdict']}"
    )
    return EXIT_PASS


def gate_rollback(client: Client, args: argparse.Namespace) -> int:
    deployment = client.request("POST", f"/api/v1/gates/{client.gate_id(args.gate)}/rollback/", {"note": args.note})
    print(
        f"deployment {deployment['id']}: checkpoint {deployment['checkpoint']} is current again "
        f"(rolled back from deployment {deployment['rolled_back_from']})"
    )
    return EXIT_PASS


def eval_run(client: Client, args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"benchmark_version": args.benchmark_version, "k": args.k}
    if args.checkpoint:
        body["checkpoint"] = args.checkpoint
    else:
        body["base_model"] = args.base_model
    evaluation = client.request("POST", "/api/v1/evals/", body)
    deadline = time.monotonic() + args.timeout
    while args.wait and evaluation["status"] in ("pending", "running"):
        if time.monotonic() > deadline:
            raise CliError(f"eval {evaluation['id']} still {evaluation['status']} after {args.timeout:.0f} s")
        time.sleep(args.poll)
        evaluation = client.request("GET", f"/api/v1/evals/{evaluation['id']}/")
        print(
            f"eval {evaluation['id']}: {evaluation['progress_done']}/{evaluation['progress_total']} tasks",
            file=sys.stderr,
        )
    print(json.dumps(evaluation, indent=2))
    if evaluation["status"] in ("failed", "stopped"):
        return EXIT_ERROR
    return EXIT_PASS


def api_call(client: Client, args: argparse.Namespace) -> int:
    try:
        body = json.loads(args.body) if args.body else None
    except json.JSONDecodeError as exc:
        raise CliError(f"the body is not JSON ({exc}); quote it, e.g. '{{\"k\": 1}}'")
    print(json.dumps(client.request(args.method.upper(), args.path, body, ok=tuple(range(200, 300))), indent=2))
    return EXIT_PASS


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="crucible", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    top.add_argument("--url", default=os.environ.get("CRUCIBLE_URL", "http://127.0.0.1:8000"))
    top.add_argument("--token", default=os.environ.get("CRUCIBLE_TOKEN", ""))
    groups = top.add_subparsers(dest="group", required=True)

    gate = groups.add_parser("gate", help="deployment gates").add_subparsers(dest="command", required=True)
    check = gate.add_parser("check", help="gate a checkpoint; exit 0 pass, 1 fail, 2 error")
    check.add_argument("--gate", required=True, help="gate name or id")
    which = check.add_mutually_exclusive_group(required=True)
    which.add_argument("--checkpoint", type=int, help="checkpoint id")
    which.add_argument("--checkpoint-uri", help="a registered checkpoint's URI")
    check.add_argument("--benchmark-version", type=int, action="append", help="pin a version (repeatable)")
    check.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait for the decision")
    check.add_argument("--poll", type=float, default=5.0)
    check.add_argument("--wait-approval", action="store_true", help="wait for a human to approve or reject")
    check.add_argument(
        "--pending-ok", action="store_true", help="exit 0 when the rules pass and only an approval is missing"
    )
    check.add_argument("--markdown", help="also write the summary to this file")
    check.set_defaults(handler=gate_check)
    for verb in ("approve", "reject"):
        judge = gate.add_parser(verb, help=f"{verb} a decision (approve permission)")
        judge.add_argument("decision", type=int)
        judge.add_argument("--note", default="")
        judge.set_defaults(handler=gate_judge)
    rollback = gate.add_parser("rollback", help="make the previous deployment current again")
    rollback.add_argument("--gate", required=True)
    rollback.add_argument("--note", default="")
    rollback.set_defaults(handler=gate_rollback)

    evals = groups.add_parser("eval", help="benchmark evals").add_subparsers(dest="command", required=True)
    run = evals.add_parser("run", help="evaluate a checkpoint or a base model on a benchmark version")
    run.add_argument("--benchmark-version", type=int, required=True)
    model = run.add_mutually_exclusive_group(required=True)
    model.add_argument("--checkpoint", type=int)
    model.add_argument("--base-model")
    run.add_argument("--k", type=int, default=1)
    run.add_argument("--wait", action="store_true")
    run.add_argument("--timeout", type=float, default=3600.0)
    run.add_argument("--poll", type=float, default=5.0)
    run.set_defaults(handler=eval_run)

    api = groups.add_parser("api", help="call any endpoint: crucible api GET /api/v1/runs/")
    api.add_argument("method")
    api.add_argument("path")
    api.add_argument("body", nargs="?", help="JSON body")
    api.set_defaults(handler=api_call)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        client = Client(args.url, args.token)
        code: int = args.handler(client, args)
    except CliError as exc:
        print(f"crucible: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except Exception as exc:  # anything unexpected is an infrastructure error, never a failed gate (exit 1)
        print(f"crucible: unexpected error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    return code


if __name__ == "__main__":
    sys.exit(main())
