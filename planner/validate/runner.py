"""Running the emitted job under torchrun so that nothing can hang `planner validate`.

torchrun starts in a session of its own; its workers start sessions of their own too (torch
elastic's SubprocessHandler uses start_new_session), so every process carries an environment marker
and teardown finds them by it: SIGTERM to torchrun's group (torchrun then stops its workers), SIGKILL
after a grace period, and SIGKILL to any process still carrying the marker. Workers also exit when
their launcher dies (worker.watchdog).

Three clocks guard a run: the overall timeout, the per-step timeout (a step that started and did
not end), and the collective timeout inside the job (gloo/NCCL `timeout`). Whatever fires, the
result names one cause in one line and keeps what the ranks wrote before it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MARKER = "PLANNER_VALIDATE_ID"
POLL_S = 0.2
ERROR_GRACE_S = 5.0  # after a rank reports an error: time for torchrun to stop the others itself
TERM_GRACE_S = 5.0  # after SIGTERM: time before SIGKILL
KILL_WAIT_S = 2.0  # after SIGKILL to torchrun's group: time for it to exit
# SIGTERM or SIGINT to planner validate: torchrun and every rank are gone within
# TERM_GRACE_S + KILL_WAIT_S + TERM_GRACE_S (marker sweep) = 12 s, under Slurm's default KillWait of 30 s.
TEARDOWN_LIMIT_S = 2 * TERM_GRACE_S + KILL_WAIT_S
STUCK_GRACE_S = 2.0  # after the per-step timeout: time for the workers' watchdogs to say where they are

# Messages a rank gets when a peer died or stopped: not a cause of their own.
PEER_SIGNS = ("connection closed by peer", "connection reset by peer", "broken pipe", "timed out waiting",
              "timeout", "nccl watchdog", "signalexception", "sigterm")


@dataclass
class LaunchResult:
    ok: bool
    cause: str | None  # one line when not ok
    returncode: int | None
    wall_s: float
    launch_id: str
    command: list[str]
    results: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # run -> per-rank results
    steps_done: int = 0
    killed: list[int] = field(default_factory=list)  # marker processes still alive after teardown
    signal: int | None = None  # SIGTERM/SIGINT that stopped the run


def _die_with_parent() -> None:
    """In torchrun's process before exec: SIGTERM when planner dies, even by SIGKILL (Linux
    PR_SET_PDEATHSIG), so that torchrun stops its ranks rather than outlive the command."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class _Stop(BaseException):
    """Raised in the main thread by the SIGTERM/SIGINT handler, to reach the teardown."""


@contextmanager
def _stop_on_signals(state: dict[str, Any]) -> Iterator[None]:
    """While the job runs, SIGTERM and SIGINT stop the wait (not the process) so that the teardown
    runs; a second signal during the teardown is recorded, not acted on."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        state.setdefault("signal", signum)
        if not state.get("tearing_down"):
            raise _Stop()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def emit(out_dir: Path, doc: dict[str, Any]) -> Path:
    """Write job.json and a copy of the worker into `out_dir`; clear what an earlier run left."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for pattern in ("progress_rank*.jsonl", "error_rank*.json", "stuck_rank*.json"):
        for old in out_dir.glob(pattern):
            old.unlink()
    for run in doc["runs"]:
        shutil.rmtree(out_dir / run["name"], ignore_errors=True)
    shutil.copyfile(Path(__file__).with_name("worker.py"), out_dir / "worker.py")
    (out_dir / "job.json").write_text(json.dumps(doc, indent=1) + "\n")
    return out_dir / "job.json"


def find_processes(launch_id: str) -> list[int]:
    """Processes whose environment carries this launch's marker (Linux /proc)."""
    needle = f"{MARKER}={launch_id}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _teardown(proc: subprocess.Popen, launch_id: str) -> list[int]:
    """Stop torchrun and every worker; return the marker processes that needed a SIGKILL."""
    for sig, wait in ((signal.SIGTERM, TERM_GRACE_S), (signal.SIGKILL, KILL_WAIT_S)):
        if proc.poll() is not None:
            break
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            pass
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + TERM_GRACE_S
    left = [p for p in find_processes(launch_id) if _alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(POLL_S)
        left = [p for p in find_processes(launch_id) if _alive(p)]
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _progress(out_dir: Path, nproc: int) -> list[list[dict[str, Any]]]:
    events = []
    for r in range(nproc):
        path = out_dir / f"progress_rank{r}.jsonl"
        rows = []
        try:
            for line in path.read_text().splitlines():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    break  # a line being written
        except OSError:
            pass
        events.append(rows)
    return events


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "unknown"
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def _where(err: dict[str, Any]) -> str:
    step, run = err.get("step", -1), err.get("run") or ""
    at = f"at step {step}" if step is not None and step >= 0 else "during setup"
    return f"{at}{' of run ' + run if run else ''}"


def _is_peer_failure(err: dict[str, Any]) -> bool:
    text = f"{err.get('type', '')} {err.get('message', '')}".lower()
    return any(sign in text for sign in PEER_SIGNS) and not err.get("oom")


def failure_cause(out_dir: Path, nproc: int, *, stalled: bool, timed_out_s: float | None, returncode: int | None) -> str:
    """One line: which rank failed, where, and why."""
    errors = [e for r in range(nproc) if (e := _read_json(out_dir / f"error_rank{r}.json"))]
    stuck = [s for r in range(nproc) if (s := _read_json(out_dir / f"stuck_rank{r}.json"))]
    own = sorted((e for e in errors if not _is_peer_failure(e)), key=lambda e: e.get("t", 0))
    if own:
        e = own[0]
        if e.get("oom"):
            return (f"OOM on rank {e['rank']} {_where(e)}: needed {fmt_bytes(e.get('needed_bytes'))}, "
                    f"had {fmt_bytes(e.get('available_bytes'))} free")
        return f"rank {e['rank']} failed {_where(e)}: {e.get('type')}: {e.get('message')}"
    hung = [s for s in stuck if not s.get("in_collective")]
    if hung:
        s = hung[0]
        waiting = sorted(x["rank"] for x in stuck if x.get("in_collective"))
        others = f"; rank(s) {', '.join(map(str, waiting))} waited for it in a collective" if waiting else ""
        where = s["where"][-1] if s.get("where") else "unknown place"
        return f"rank {s['rank']} hung at step {s['step']} of run {s['run']} ({where}){others}"
    if errors:
        silent = sorted(set(range(nproc)) - {e["rank"] for e in errors})
        e = sorted(errors, key=lambda x: x.get("t", 0))[0]
        root = root_cause(_log_lines(out_dir))
        if silent and root is not None and root[0] in silent:
            return f"rank {root[0]} died {_last_step(out_dir, root[0])}: {root[2]}; the others failed waiting for it"
        if silent:
            return (f"rank(s) {', '.join(map(str, silent))} stopped responding {_where(e)}: the others failed waiting "
                    f"for them ({e.get('message')})")
        return f"rank {e['rank']} failed {_where(e)}: {e.get('type')}: {e.get('message')}"
    if stuck:
        s = stuck[0]
        return f"step {s['step']} of run {s['run']} made no progress for {s['seconds']:.0f} s on any rank (all waiting in collectives)"
    if stalled:
        return "a step ran past the per-step timeout and no rank said where it was"
    if timed_out_s is not None:
        return f"the job did not finish within the overall timeout of {timed_out_s:.0f} s"
    lines = _log_lines(out_dir)
    root = root_cause(lines)
    if root is not None:
        rank, code, why = root
        return f"rank {rank} died {_last_step(out_dir, rank)}: {why}"
    hint = next((ln for ln in reversed(lines) if "Error" in ln or "error" in ln), lines[-1] if lines else "no output")
    return f"torchrun exited with code {returncode}: {hint}"


def _log_lines(out_dir: Path) -> list[str]:
    log = out_dir / "launch.log"
    try:
        return [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return []


def _last_step(out_dir: Path, rank: int) -> str:
    """Where a rank was when it died, from its progress file."""
    rows = _progress(out_dir, rank + 1)[rank]
    steps = [e for e in rows if "step" in e]
    if not steps:
        return "during setup" if rows else "before it started"
    last = steps[-1]
    run = f" of run {last['run']}" if last.get("run") else ""
    return f"{'in' if last.get('phase') == 'start' else 'after'} step {last['step']}{run}"


def root_cause(lines: list[str]) -> tuple[int, int, str] | None:
    """(rank, exit code, why) of torchrun's "Root Cause (first observed failure)" block, the one a
    rank that died without writing its error file (killed, os._exit, an import error) leaves."""
    try:
        start = next(i for i, ln in enumerate(lines) if ln.startswith("Root Cause"))
    except StopIteration:
        return None
    fields: dict[str, str] = {}
    for ln in lines[start + 1 : start + 12]:
        key, sep, value = ln.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    try:
        rank = int(fields["rank"].split()[0])
        code = int(fields["exitcode"].split()[0])
    except (KeyError, ValueError, IndexError):
        return None
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return rank, code, f"killed by {name} (exit code {code}{': the kernel OOM killer or a kill -9' if -code == signal.SIGKILL else ''})"
    error = next((ln for ln in reversed(lines[:start])
                  if re.match(r"^[A-Za-z_.]*(Error|Exception|Exit)\b", ln) and "ChildFailedError" not in ln), None)
    return rank, code, f"exited with code {code}" + (f": {error}" if error else "")


def launch(
    out_dir: Path,
    nproc: int,
    *,
    timeout_s: float,
    step_timeout_s: float,
    on_progress: Callable[[int, int], None] | None = None,
) -> LaunchResult:
    """Run out_dir/worker.py on `nproc` local ranks under torchrun and wait for it, or tear it down."""
    doc = json.loads((out_dir / "job.json").read_text())
    per_rank_steps = sum(r["warmup"] + r["unprofiled_steps"] + r["steps"] for r in doc["runs"])
    launch_id = uuid.uuid4().hex
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "--max-restarts=0", "worker.py", "job.json"]
    env = dict(os.environ, **{MARKER: launch_id})
    env.setdefault("PYTHONUNBUFFERED", "1")
    start = time.monotonic()
    state: dict[str, Any] = {}
    error_seen = None
    stalled = False
    timed_out = None
    done = 0
    proc: subprocess.Popen | None = None
    killed: list[int] = []
    with open(out_dir / "launch.log", "w") as log, _stop_on_signals(state):
        try:
            proc = subprocess.Popen(cmd, cwd=out_dir, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                    preexec_fn=_die_with_parent)
            while True:
                rc = proc.poll()
                events = _progress(out_dir, nproc)
                ends = [sum(1 for e in rows if e.get("phase") == "end") for rows in events]
                if min(ends) != done:
                    done = min(ends)
                    if on_progress:
                        on_progress(done, per_rank_steps)
                if rc is not None:
                    break
                now = time.time()
                if any((out_dir / f"error_rank{r}.json").exists() for r in range(nproc)):
                    error_seen = error_seen or time.monotonic()
                    if time.monotonic() - error_seen > ERROR_GRACE_S:
                        break
                for rows in events:
                    last = rows[-1] if rows else None
                    if last and last.get("phase") == "start" and now - last["t"] > step_timeout_s + STUCK_GRACE_S:
                        stalled = True
                if stalled:
                    break
                if time.monotonic() - start > timeout_s:
                    timed_out = timeout_s
                    break
                time.sleep(POLL_S)
        except _Stop:
            pass
        finally:
            state["tearing_down"] = True
            if proc is not None:
                killed = _teardown(proc, launch_id)
    rc = proc.returncode if proc is not None else None
    wall = time.monotonic() - start
    done = min(sum(1 for e in rows if e.get("phase") == "end") for rows in _progress(out_dir, nproc))  # the last word
    results: dict[str, list[dict[str, Any]]] = {}
    for run in doc["runs"]:
        rows = [_read_json(out_dir / run["name"] / f"result_rank{r}.json") for r in range(nproc)]
        results[run["name"]] = [r for r in rows if r is not None]
    complete = all(len(v) == nproc for v in results.values())
    stopped_by = state.get("signal")
    ok = rc == 0 and complete and not stalled and timed_out is None and error_seen is None and stopped_by is None
    if stopped_by is not None:
        name = signal.Signals(stopped_by).name
        cause = (f"stopped by {name} after {done} of {per_rank_steps} steps; torchrun and its {nproc} rank(s) were "
                 f"torn down ({len(killed)} needed SIGKILL)")
    else:
        cause = None if ok else failure_cause(out_dir, nproc, stalled=stalled, timed_out_s=timed_out, returncode=rc)
    return LaunchResult(ok=ok, cause=cause, returncode=rc, wall_s=wall, launch_id=launch_id, command=cmd,
                        results=results, steps_done=done, killed=killed, signal=stopped_by)
