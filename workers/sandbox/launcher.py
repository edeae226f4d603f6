"""The program that runs inside the sandbox's process: it confines itself, then runs the untrusted `main.py`.

Started by `workers.sandbox.runner` as `python -I -S launcher.py <config JSON>`, in a fresh session, with a minimal
environment and the sandbox's private directory as its working directory. It imports only the standard library
(isolated mode, no site) so that nothing from the project or the virtual environment runs before the
restrictions are in place.

Two processes result:

    launcher  (keeps the caller's uid; outside the Landlock domain, inside the new network and mount namespaces)
      |  as root, unless the uid's last check ended cleanly: kill whatever still runs under the check's uid
      |  (a helper that takes that uid and calls kill(-1))
      |  unshare(NEWNET | NEWPID | NEWIPC | NEWNS [| NEWUSER when not root]); mount a size-capped tmpfs over
      |  the check's directory and copy the caller's files into it; build the Landlock ruleset; as root, when the
      |  caller asked for its interpreter (python_dirs) and a directory above it is closed to the check's uid,
      |  mount a small tmpfs over that directory holding bind mounts of the interpreter's directories alone; fork
      `- child = PID 1 of the new PID namespace
            setsid; close stray fds; rlimits; drop to the check's own uid/gid (or drop capabilities when not
            root); no_new_privs; landlock_restrict_self; install the monitor (monitor.py); run main.py in a
            fresh __main__ module

The launcher enforces the wall-time limit on the child and SIGKILLs it when it runs over. Because the child is
PID 1 of its namespace, the kernel then kills every process it left behind (fork bombs, setsid escapes), and
the launcher only returns once all of them are gone. As root it then takes the check's uid itself and kills
every process left under it (kill(-1) as that uid, which no fork can race), so nothing of the check outlives it
even where the PID namespace was unavailable. The launcher writes one JSON line describing how the child ended,
with what it observed, to the file descriptor named in the config (`report_fd`); the child closes that
descriptor before the untrusted code runs, so the code cannot forge the report.

Observations: the launcher itself sees the limits (processes alive at a wall-time kill, files at the size limit,
the workspace's tmpfs full, peak memory near the limit) and processes that outlived the program (source
"sandbox"); the monitor in the child reports refused calls through a non-blocking pipe (source "program",
forgeable by the program: see monitor.py).

Protocol between child and launcher: the child writes one JSON line to a private setup pipe, `{"ok": true,
"layers": [...]}` once every restriction is in place or `{"ok": false, "message": ...}` when one could not be
applied, and closes it before running the code. A child that exits without saying "ok" failed during setup,
which is reported as a sandbox error, never blamed on the code.

The parts, each a stdlib-only file beside this one that the launcher loads by path before anything else (see
`_load`): `launcher_linux.py` (the kernel constants, ctypes structures and system-call helpers),
`launcher_confine.py` (the plan the child inherits, and the launcher's side of the confinement: namespaces,
workspace tmpfs, Landlock ruleset, the interpreter's directories), `launcher_supervise.py` (the wall-time limit,
the launcher's observations, the uid sweeps, the report) and `launcher_child.py` (the child's restrictions and the
run of main.py). This file runs the steps in order: `_prepare`, then the fork, then `main` reports.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
import time
import types
from typing import TYPE_CHECKING, Any

# The launcher's parts, beside this file: in isolated mode (no site) this directory is not on sys.path, and nothing
# may be imported from the project or the virtual environment, so each part is loaded by its absolute path, under
# a private name in sys.modules (the name the parts use to find each other: crucible_sandbox_ + the file's stem).
# All of them are loaded here, as the caller's uid and before the fork: the child could not reach these files once
# confined, and needs none of them by then. The source loader keeps (and reuses) their compiled form in
# __pycache__, as any import would.
_HERE = os.path.dirname(os.path.abspath(__file__))


def _load(stem: str) -> types.ModuleType:
    path = os.path.join(_HERE, f"{stem}.py")
    name = f"crucible_sandbox_{stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"could not load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


if TYPE_CHECKING:
    from workers.sandbox import launcher_child as child
    from workers.sandbox import launcher_confine as confine
    from workers.sandbox import launcher_linux as linux
    from workers.sandbox import launcher_supervise as supervise
else:  # in this order: each part finds the ones before it in sys.modules
    linux = _load("launcher_linux")  # Linux constants, ctypes structures, system-call helpers
    confine = _load("launcher_confine")  # the plan; namespaces, workspace tmpfs, Landlock ruleset, python dirs
    supervise = _load("launcher_supervise")  # the wall-time limit, the observations, the uid sweeps, the report
    child = _load("launcher_child")  # PID 1 of the namespaces: restricts itself, runs the code


def _prepare(cfg: dict[str, Any]) -> confine.Plan:
    # Die with the caller: a SIGKILLed caller must not leave the launcher (and so the sandbox) running.
    linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != int(cfg["parent_pid"]):
        raise RuntimeError("the calling process exited before the sandbox started")
    plan = confine.Plan(
        strict=cfg["mode"] == "strict",
        is_root=os.geteuid() == 0,
        uid=int(cfg["uid"]) if os.geteuid() == 0 else os.getuid(),
        gid=int(cfg["gid"]) if os.geteuid() == 0 else os.getgid(),
        workdir=os.path.realpath(cfg["workdir"]),
    )
    if plan.is_root:
        if plan.uid == 0 or plan.gid == 0:
            raise RuntimeError("refusing to run the program as root")
        if cfg.get("sweep_before", True):
            supervise.sweep_uid_before(plan)
    simulate = set(cfg.get("simulate_unavailable", ()))
    confine.enter_namespaces(plan, simulate)
    confine.mount_workspace(plan, cfg["limits"], simulate)
    python_dirs = [str(path) for path in cfg.get("python_dirs") or []]
    confine.build_ruleset(plan, simulate, python_dirs)
    confine.open_python_roots(plan)
    plan.monitor = _load("monitor")  # now: the child, once confined, could not reach the file
    if python_dirs:
        confine.expose_dirs(plan, python_dirs)
    plan.setup_r, plan.setup_w = os.pipe()
    plan.life_r, plan.life_w = os.pipe()
    plan.obs_r, plan.obs_w = os.pipe()
    # Neither side may ever block on the monitor's pipe: the program drops a line, the launcher reads what is there.
    os.set_blocking(plan.obs_w, False)
    os.set_blocking(plan.obs_r, False)
    return plan


def main(argv: list[str]) -> int:
    try:
        cfg: dict[str, Any] = json.loads(argv[1])
        report_fd = int(cfg["report_fd"])
    except (IndexError, ValueError, KeyError, TypeError) as exc:
        print(f"crucible sandbox launcher: bad configuration: {exc}", file=sys.stderr)
        return 2
    try:
        plan = _prepare(cfg)
    except confine.Unavailable as exc:
        supervise.write_report(report_fd, {"kind": "unavailable", "message": str(exc)})
        return 0
    except Exception as exc:
        supervise.write_report(
            report_fd, {"kind": "error", "message": f"sandbox setup failed: {type(exc).__name__}: {exc}"}
        )
        return 0
    started = time.monotonic()
    try:
        pid = os.fork()
    except OSError as exc:
        supervise.write_report(report_fd, {"kind": "error", "message": f"fork failed: {exc}"})
        return 0
    if pid == 0:
        return child.run(cfg, plan)
    try:
        report = supervise.run(cfg, plan, pid, started)
    except Exception as exc:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
        report = {"kind": "error", "message": f"sandbox supervision failed: {type(exc).__name__}: {exc}"}
    supervise.write_report(report_fd, report)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
