"""The sandbox supervisor of `workers.coding.execute.run_command`: `PROGRAM`, the Python source that runs inside
the sandbox as PID 1 of its PID namespace. It writes the workspace's tree out of tree.bin, runs the command with
its limits, kills what it left running, finds the files it changed and prints one JSON report; `run_command`
(in `workers.coding.execute`, with the limits, the result and the parsing of that report) sends it in and reads
the report back.
"""

# Runs inside the sandbox under `python -I -S` with only the standard library, as PID 1 of the sandbox's PID
# namespace. Reads command.json; writes one JSON line to stdout.
PROGRAM = r'''
import base64, errno, hashlib, json, os, posix, resource, selectors, signal, stat, subprocess, time

ROOT = os.getcwd()
REPO = os.path.join(ROOT, "repo")
SKIP_DIRS = {"__pycache__", ".pytest_cache"}
WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
FORK_FAILURES = ("fork: retry", "can't fork", "cannot fork", "fork failed", "resource temporarily unavailable")
with open(os.path.join(ROOT, "command.json"), encoding="utf-8") as fh:
    CFG = json.load(fh)
found = []


def observe(kind, what, detail, target=""):
    found.append({"kind": kind, "what": what, "detail": detail, "target": target, "source": "sandbox"})


def unpack_tree():
    """Write the files of tree.bin (their contents back to back, named and sized by the manifest) under REPO;
    returns path -> (sha256, stat key) of each."""
    with open(os.path.join(ROOT, "tree.bin"), "rb") as fh:
        data = fh.read()
    os.unlink(os.path.join(ROOT, "tree.bin"))  # its room on the tmpfs goes back to the command
    os.makedirs(REPO, exist_ok=True)
    made = set()
    known = {}
    offset = 0
    for rel, size in CFG["manifest"]:
        content = data[offset : offset + size]
        offset += size
        parent = os.path.dirname(rel)
        if parent and parent not in made:
            os.makedirs(os.path.join(REPO, parent), exist_ok=True)
            made.add(parent)
        # posix.* rather than open(): the sandbox's monitor wraps open() and os.open() to report refusals, which
        # costs more than the write itself here, and nothing can be refused in our own directory.
        fd = posix.open(os.path.join(REPO, rel), WRITE_FLAGS, 0o644)
        try:
            view = memoryview(content)
            while view:
                view = view[posix.write(fd, view) :]
            key = stat_key(posix.fstat(fd))
        finally:
            posix.close(fd)
        known[rel] = (hashlib.sha256(content).hexdigest(), key)
    return known


def stat_key(st):
    # Any write changes ctime, which no call can set back: an equal key means equal content.
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


def scan(known):
    """relative path -> sha256 of every regular file under REPO (skipped directories aside); a file whose stat
    matches `known` is not read again."""
    result = {}
    stack = [REPO]
    while stack:
        current = stack.pop()
        try:
            entries = list(os.scandir(current))
        except PermissionError:
            try:
                os.chmod(current, 0o700)  # the command may have closed a directory it owns
                entries = list(os.scandir(current))
            except OSError:
                continue
        except OSError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                if entry.name not in SKIP_DIRS:
                    stack.append(entry.path)
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            rel = entry.path[len(REPO) + 1 :]
            try:
                rel.encode("utf-8")
            except UnicodeEncodeError:
                observe("limit", "changes", "a file name that is not UTF-8 was not kept", ascii(rel))
                continue
            previous = known.get(rel)
            result[rel] = previous[0] if previous and previous[1] == stat_key(st) else digest(entry.path)
    return result


def digest(path):
    h = hashlib.sha256()
    try:
        fh = open(path, "rb")
    except PermissionError:
        os.chmod(path, 0o600)
        fh = open(path, "rb")
    with fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


class Capture:
    """Keep the first and the last `cap` bytes of a stream; count the characters in between."""

    def __init__(self, cap):
        self.cap = cap
        self.head = bytearray()
        self.tail = bytearray()
        self.cut = 0

    def add(self, chunk):
        room = self.cap - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if not chunk:
            return
        self.tail += chunk
        if len(self.tail) > self.cap:
            dropped = bytes(self.tail[: len(self.tail) - self.cap])
            del self.tail[: len(self.tail) - self.cap]
            self.cut += len(dropped.decode("utf-8", "replace"))


def others_left():
    """Whether any other process is left: in a PID namespace every process descends from PID 1 (us), and an orphan
    is re-parented to it, so none is left exactly when we have no child."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)  # (0, 0) while children run; reaps one that already exited
        except ChildProcessError:
            return False
        if pid == 0:
            return True


def kill_rest():
    """Kill every other process of the namespace (we are its PID 1) and reap them; how many there were."""
    if os.getpid() == 1:
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
    reaped = 0
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            time.sleep(0.01)
            continue
        reaped += 1
    return reaped


def main():
    phase_started = time.monotonic()
    known = unpack_tree()
    unpack_seconds = time.monotonic() - phase_started
    os.makedirs(os.path.join(ROOT, "home"), exist_ok=True)
    os.makedirs(os.path.join(ROOT, "tmp"), exist_ok=True)
    pythonpath = [REPO] + ([os.path.join(REPO, "src")] if os.path.isdir(os.path.join(REPO, "src")) else [])
    env = {
        "PATH": ":".join(CFG["path"] + ["/usr/local/bin", "/usr/bin", "/bin"]),
        "HOME": os.path.join(ROOT, "home"),
        "TMPDIR": os.path.join(ROOT, "tmp"),
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        "CRUCIBLE_SANDBOX": "1",
    }
    extra = dict(CFG.get("env") or {})
    if extra.get("PYTHONPATH"):
        pythonpath = [os.path.join(REPO, p) for p in extra.pop("PYTHONPATH").split(":") if p] + pythonpath
    env.update(extra)
    env["PYTHONPATH"] = ":".join(pythonpath)
    cap = int(CFG["max_output_bytes"])
    streams = {"stdout": Capture(cap // 2), "stderr": Capture(cap - cap // 2)}
    started = time.monotonic()
    deadline = started + float(CFG["wall_seconds"])
    wall_killed = False
    try:
        proc = subprocess.Popen(
            ["/bin/sh", "-c", CFG["command"]], cwd=REPO, env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
        )
    except OSError as exc:
        print(json.dumps({"exit_code": None, "signal": None, "stderr_head": base64.b64encode(
            f"could not start /bin/sh: {exc}".encode()).decode(), "observations": found, "seconds": 0.0}))
        return
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ, streams["stdout"])
    selector.register(proc.stderr, selectors.EVENT_READ, streams["stderr"])
    drain_until = None
    while selector.get_map():
        now = time.monotonic()
        remaining = deadline - now
        if remaining <= 0:
            wall_killed = True
            break
        if drain_until is None and proc.poll() is not None:
            # The shell is done; a background process it left may hold the pipes open: read what is there, then go
            # on without waiting for it (it is killed below).
            drain_until = now + 0.2
        if drain_until is not None and now >= drain_until:
            break
        for key, _ in selector.select(min(remaining, 0.05 if drain_until is not None else 0.1)):
            chunk = os.read(key.fd, 65536)
            if chunk:
                key.data.add(chunk)
            else:
                selector.unregister(key.fileobj)
    if not wall_killed:
        try:
            proc.wait(max(deadline - time.monotonic(), 0.001))
        except subprocess.TimeoutExpired:
            wall_killed = True
    seconds = time.monotonic() - started
    if wall_killed:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
    returncode = proc.wait() if not wall_killed else None
    left = kill_rest() if wall_killed or others_left() else 0  # background processes, or a killed command's all
    if returncode is None:
        returncode = proc.wait()
    for key in list(selector.get_map().values()):
        selector.unregister(key.fileobj)
    selector.close()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = usage.ru_utime + usage.ru_stime
    sig = -returncode if returncode < 0 else None
    if sig is None and returncode > 128 and returncode - 128 in (signal.SIGKILL, signal.SIGXCPU):
        sig = returncode - 128  # the shell's report of its child's death by that signal
    exit_code = returncode if returncode >= 0 and not wall_killed else None
    stderr_text = bytes(streams["stderr"].head + streams["stderr"].tail).decode("utf-8", "replace")
    cpu_killed = sig in (signal.SIGKILL, signal.SIGXCPU) and not wall_killed and cpu >= 0.85 * CFG["cpu_seconds"] - 0.05
    if wall_killed:
        observe("limit", "wall time", f"wall time limit {CFG['wall_seconds']:g} s exceeded; the command was killed")
    if cpu_killed:
        observe("limit", "cpu time", f"CPU time limit {CFG['cpu_seconds']} s exceeded")
    if left and not wall_killed:
        observe("cleanup", "processes", f"{left} process(es) still running after the command ended were killed")
    elif left >= int(CFG["max_processes"]) - 2:
        observe("limit", "processes", f"{left} processes were running at the kill (limit {CFG['max_processes']})")
    lowered = stderr_text.lower()
    if any(s in lowered for s in FORK_FAILURES):
        observe("limit", "processes", f"the command hit the limit of {CFG['max_processes']} processes")
    if "memoryerror" in lowered or "cannot allocate memory" in lowered:
        observe("limit", "memory", "the command ran out of memory (its address-space limit)")
    if "no space left on device" in lowered:
        observe("limit", "disk", "the workspace's disk filled up")
    if "file too large" in lowered:
        observe("limit", "file size", "a file reached the per-file size limit")
    for name, capture in streams.items():
        if capture.cut:
            observe("limit", "output", f"{capture.cut} characters of {name} were cut", name)
    phase_started = time.monotonic()
    after = scan(known)
    scan_seconds = time.monotonic() - phase_started
    changed, not_applied = {}, []
    budget = int(CFG["max_changed_bytes"])
    for rel in sorted(after):
        if rel in known and known[rel][0] == after[rel]:
            continue
        try:
            size = os.stat(os.path.join(REPO, rel)).st_size
        except OSError:
            continue
        if size > budget:
            not_applied.append(rel)
            continue
        try:
            with open(os.path.join(REPO, rel), "rb") as fh:
                data = fh.read(size + 1)
        except OSError:
            not_applied.append(rel)
            continue
        budget -= len(data)
        changed[rel] = base64.b64encode(data).decode()
    if not_applied:
        observe("limit", "changes", f"{len(not_applied)} changed file(s) over the {CFG['max_changed_bytes']}-byte "
                "limit of changes were not kept: " + ", ".join(not_applied[:5]))
    deleted = sorted(set(known) - set(after))
    report = {
        "exit_code": exit_code, "signal": sig, "wall_killed": wall_killed, "cpu_killed": cpu_killed,
        "cpu_seconds": cpu, "seconds": seconds, "changed": changed, "deleted": deleted, "not_applied": not_applied,
        "observations": found,
        "phases": {"unpack": unpack_seconds, "command": seconds, "scan": scan_seconds},
    }
    for name, capture in streams.items():
        report[name + "_head"] = base64.b64encode(bytes(capture.head)).decode()
        report[name + "_tail"] = base64.b64encode(bytes(capture.tail)).decode()
        report[name + "_cut"] = capture.cut
    print("\n" + json.dumps(report), flush=True)


main()
'''
