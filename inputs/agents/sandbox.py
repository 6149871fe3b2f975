"""A per-episode sandbox for the coding agent (coding_agent.py): a fresh directory the model's
files live in, and a runner that tests its sol.py in a child process under limits.

What it does: files are plain names inside the directory (no paths, no dot files, 64 KiB at
most; symbolic links and non-regular files are refused). run_cases() imports sol.py in
`/usr/bin/python3 -I -S -B` with cwd = the directory, an environment of PATH and LANG only,
stdin closed, its own process group, and rlimits: 2 s CPU, 512 MiB address space, 1 MiB
per written file, 64 open files, no core dumps; the group is killed after 5 s of wall time
or when the run ends. The child is given the inputs alone and prints f's results; this
process compares them with the expected values, so the hidden cases never reach it. Where
`unshare` may (as root, or through an unprivileged user namespace) the child runs in new
network and pid namespaces with its own /proc: no network (a down loopback), and no sight of
other processes (the agent's environment, which holds the hidden cases, included); failing
that, a network namespace alone; failing that, neither (Sandbox.isolation says which).

What it does not guarantee: there is no seccomp filter and no mount namespace for files, so
the model's code can read and write whatever host files its user can (other episodes'
sandboxes, the run directory), and without a pid namespace it can read the agent's
environment from /proc. Run the agent as an unprivileged user in a container for untrusted
models.
"""
import errno
import json
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading

MAX_FILE = 64 * 1024  # bytes per file written or read through the sandbox, and per captured stream
WALL_S = 5
CPU_S = 2
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable

# Run in the child with argv = [inputs as JSON, module, function]; prints one JSON line: f's
# result for each input, as [true, the result as JSON, its repr] or [false, the error]. The
# child never sees the expected values: the parent compares (so code that forges the line
# gains nothing it could not get by computing f).
HARNESS = r"""
import json, os, sys

def describe(e):
    if isinstance(e, SyntaxError):
        return f"SyntaxError: {e.msg} (line {e.lineno})"
    if isinstance(e, MemoryError):
        return "MemoryError: memory limit"
    text = str(e).strip().split("\n")[0]
    return (f"{type(e).__name__}: {text}" if text else type(e).__name__)[:200]

inputs, module, func = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
result = {"values": [], "error": ""}
out, sys.stdout = sys.stdout, sys.stderr  # the solution's prints go to stderr
sys.path.insert(0, os.getcwd())
try:
    f = getattr(__import__(module), func)
except BaseException as e:
    result["error"] = describe(e)
else:
    for x in inputs:
        try:
            got = f(x)
            result["values"].append([True, json.loads(json.dumps(got)), repr(got)[:100]])
        except BaseException as e:  # (an object that is not JSON, an exception of f)
            result["values"].append([False, describe(e)])
out.write(json.dumps(result) + "\n")
"""

_net = None  # (command prefix, description), probed once per process


def _net_isolation():
    global _net
    if _net is None:
        unshare = shutil.which("unshare")
        _net = ([], "none: unshare not permitted here")
        # As root: a network namespace, entered as nobody (another user than the agent's: the
        # child can neither read the agent's environment in /proc nor write root's files).
        # Otherwise an unprivileged user namespace gives the network namespace alone.
        nobody = ["--setuid", "65534", "--setgid", "65534"]
        for flags in (["--net", *nobody], ["--user", "--map-root-user", "--net"]):
            if unshare and subprocess.run([unshare, *flags, "--", "/bin/true"], stdin=subprocess.DEVNULL,
                                          capture_output=True, timeout=10).returncode == 0:
                what = "net namespace, as nobody" if "--setuid" in flags else "net namespace"
                _net = ([unshare, *flags, "--"], f"{what} (unshare {' '.join(flags)})")
                break
    return _net


def _limit():
    """In the child before exec (unshare, then python, inherit the limits)."""
    for res, value in ((resource.RLIMIT_CPU, (CPU_S, CPU_S + 1)),  # SIGXCPU at 2 s, SIGKILL at 3 s
                       (resource.RLIMIT_AS, (512 << 20,) * 2),
                       (resource.RLIMIT_FSIZE, (1 << 20,) * 2),
                       (resource.RLIMIT_NOFILE, (64, 64)),
                       (resource.RLIMIT_CORE, (0, 0))):
        resource.setrlimit(res, value)
    # No RLIMIT_NPROC: it caps the processes of the whole real uid, not this child's, so with
    # every episode's agent under one uid a small cap would fail unrelated forks; root
    # ignores it anyway.


def _read_capped(pipe, chunks):
    """Keeps the first MAX_FILE bytes and drains the rest, so a chatty child does not block."""
    size = 0
    while chunk := pipe.read1(65536):
        if size < MAX_FILE:
            chunks.append(chunk[:MAX_FILE - size])
            size += len(chunks[-1])
    pipe.close()


class Sandbox:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="slimpi-sandbox-")
        os.chmod(self.dir, 0o755)  # readable by the child when it runs as nobody; written by the agent alone
        self.isolation = _net_isolation()[1]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        shutil.rmtree(self.dir, ignore_errors=True)

    def _open(self, name, flags):
        if not isinstance(name, str) or not name or name.startswith(".") or "/" in name or "\0" in name:
            raise ValueError(f"bad file name {name!r}: a plain name in the sandbox (no '/', no leading '.')")
        try:
            fd = os.open(os.path.join(self.dir, name), flags | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise ValueError(f"{name} is a symbolic link") from None
            raise
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise ValueError(f"{name} is not a regular file")
        return fd

    def write(self, name, text):
        data = text.encode()
        if len(data) > MAX_FILE:
            raise ValueError(f"{name} is {len(data)} bytes, over the 64 KiB limit")
        with os.fdopen(self._open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb") as fh:
            fh.write(data)

    def read(self, name):
        with os.fdopen(self._open(name, os.O_RDONLY), "rb") as fh:
            data = fh.read(MAX_FILE + 1)
        if len(data) > MAX_FILE:
            raise ValueError(f"{name} is over the 64 KiB limit")
        return data.decode(errors="replace")

    def run_cases(self, cases, module="sol", func="f"):
        """Checks func(x) == y for each [x, y] in cases against module.py: the child computes
        func(x) for the inputs alone, this process compares."""
        result = {"passed": 0, "total": len(cases), "first_failure": "", "error": ""}
        if not os.path.isfile(os.path.join(self.dir, module + ".py")):
            return {**result, "error": f"no {module}.py"}
        # -B: no __pycache__ left in the directory
        cmd = _net_isolation()[0] + [PYTHON, "-I", "-S", "-B", "-c", HARNESS, json.dumps([x for x, _ in cases]),
                                     module, func]
        proc = subprocess.Popen(cmd, cwd=self.dir, env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True, preexec_fn=_limit)
        out, err = [], []
        readers = [threading.Thread(target=_read_capped, args=a, daemon=True)
                   for a in ((proc.stdout, out), (proc.stderr, err))]
        for t in readers:
            t.start()
        try:
            proc.wait(timeout=WALL_S)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the child and anything it left in its group
        except ProcessLookupError:
            pass
        proc.wait()
        for t in readers:
            t.join(timeout=0.5)  # a process that left the group (setsid) may hold a pipe open
        if timed_out:
            return {**result, "error": f"timed out after {WALL_S} s"}
        lines = b"".join(out).decode(errors="replace").strip().split("\n")
        try:
            parsed = json.loads(lines[-1])
        except ValueError:
            parsed = None
        if isinstance(parsed, dict) and parsed.get("error"):
            return {**result, "error": str(parsed["error"])[:200]}
        if isinstance(parsed, dict) and isinstance(parsed.get("values"), list) and len(parsed["values"]) == len(cases):
            for (x, y), v in zip(cases, parsed["values"]):
                ok = isinstance(v, list) and len(v) == 3 and v[0] is True and v[1] == y
                if ok:
                    result["passed"] += 1
                elif not result["first_failure"]:
                    why = f"got {v[2]}" if isinstance(v, list) and len(v) == 3 and v[0] is True else \
                        str(v[1] if isinstance(v, list) and len(v) > 1 else v)[:200]
                    result["first_failure"] = f"{func}({x!r}) == {y!r} ({why})"
            return result
        # No result line: the child died. (Python raises MemoryError at the memory limit and
        # ignores SIGXFSZ, so those come as the harness's own errors above.)
        code = proc.returncode
        if code in (-signal.SIGXCPU, -signal.SIGKILL):
            why = "killed: CPU limit"
        elif code < 0:
            why = f"killed: {signal.strsignal(-code) or f'signal {-code}'}"
        else:
            tail = b"".join(err).decode(errors="replace").strip().split("\n")[-1]
            why = f"exited with status {code}" + (f": {tail[:200]}" if tail else "")
        return {**result, "error": why}
