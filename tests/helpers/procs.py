"""Processes a test starts can neither hang CI nor outlive it.

Every command runs in a session of its own (``start_new_session=True``), so it and everything it
starts -- DataLoader workers, ranks that Lightning's launcher relaunches, grandchildren
re-parented to init after their parent died -- share one session id. Processes that leave the
session (``torchrun`` starts each rank with ``setsid``) are found by a token in their inherited
environment. On timeout the helper first takes the Python stack of every such process
(``py-spy dump``; without py-spy, ``faulthandler`` through ``SIGABRT``), then SIGKILLs them all
and raises :class:`ProcessTimeout` with every stack in its message. After a normal exit it kills
whatever the command left behind and lists it in ``leftovers``.

Example::

    proc = run_in_session([sys.executable, "script.py"], timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not proc.leftovers
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import psutil

__all__ = [
    "TOKEN_VARIABLE",
    "Finished",
    "ProcessTimeout",
    "describe",
    "kill_sessions",
    "new_token",
    "own_children",
    "py_spy",
    "reap_children",
    "run_in_session",
    "run_together",
    "session_processes",
    "session_stacks",
    "stacks",
]


class ProcessTimeout(RuntimeError):
    """A command (or a group of ranks) did not finish in time; the message holds every stack."""

    def __init__(self, message: str, *, stdout: str = "", stderr: str = "", dump: str = "") -> None:
        super().__init__(message)
        self.stdout = stdout
        self.stderr = stderr
        self.stacks = dump


class Finished(subprocess.CompletedProcess[str]):
    """``CompletedProcess`` plus ``leftovers``: processes still alive in the session after the
    command exited (each described by pid and command line; they have been killed)."""

    def __init__(
        self, args: Any, returncode: int, stdout: str, stderr: str, leftovers: list[str]
    ) -> None:
        super().__init__(args, returncode, stdout, stderr)
        self.leftovers = leftovers


def py_spy() -> str | None:
    """The ``py-spy`` executable: on ``PATH`` or next to this interpreter; ``None`` if absent."""
    found = shutil.which("py-spy")
    if found:
        return found
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else None


TOKEN_VARIABLE = "SPEEDPACK_TEST_SESSION"


def session_processes(sids: Iterable[int], token: str | None = None) -> list[psutil.Process]:
    """Every live process (zombies excluded) whose session id is one of ``sids``, or -- with
    ``token`` -- whose environment has ``SPEEDPACK_TEST_SESSION=token``: that finds the processes
    that left the session with ``setsid`` (``torchrun`` starts each rank in a session of its own)
    and their re-parented children, since every launcher passes its environment on."""
    wanted = set(sids)
    me = os.getpid()
    found: list[psutil.Process] = []
    for proc in psutil.process_iter():
        if proc.pid == me:
            continue
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if os.getsid(proc.pid) in wanted or (
                token is not None and proc.environ().get(TOKEN_VARIABLE) == token
            ):
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def describe(proc: psutil.Process) -> str:
    """``pid <n> (ppid <m>): <command line>``, on one line, short enough for a failure message."""
    try:
        cmd = " ".join(proc.cmdline()) or proc.name()
    except psutil.Error as err:
        cmd = f"({type(err).__name__})"
    try:
        ppid = str(proc.ppid())
    except psutil.Error:
        ppid = "?"
    return f"pid {proc.pid} (ppid {ppid}): {' '.join(cmd.split())[:300]}"


def stacks(procs: Sequence[psutil.Process], timeout: float = 30.0) -> str:
    """The Python stack of every thread of each process, taken with ``py-spy dump`` (in parallel).

    Returns one block per process headed by :func:`describe`; a process py-spy cannot read (not
    Python, already gone) gets a one-line note instead. Without py-spy, returns a note saying so:
    :func:`kill_sessions` then makes each process print its own stack with ``faulthandler``.
    """
    spy = py_spy()
    if spy is None:
        return "(py-spy not found: stacks come from faulthandler, in the captured stderr)\n"
    running: list[tuple[psutil.Process, subprocess.Popen[str]]] = []
    for proc in procs:
        dump = subprocess.Popen(
            [spy, "dump", "--pid", str(proc.pid)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        running.append((proc, dump))
    deadline = time.monotonic() + timeout
    blocks: list[str] = []
    for proc, dump in running:
        try:
            out, _ = dump.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            dump.kill()
            out = dump.communicate()[0] + "\n(py-spy timed out)"
        blocks.append(f"--- {describe(proc)}\n{out.strip()}\n")
    return "\n".join(blocks)


def session_stacks(sids: Iterable[int], token: str | None = None) -> str:
    """:func:`stacks` of every process :func:`session_processes` finds."""
    return stacks(session_processes(sids, token))


def kill_sessions(
    sids: Iterable[int], token: str | None = None, faulthandler_first: bool = False
) -> list[str]:
    """SIGKILL every process :func:`session_processes` finds (and the sessions' process groups);
    return what was killed, described. With ``faulthandler_first``, each first gets ``SIGABRT``
    (with ``PYTHONFAULTHANDLER=1`` set, Python prints every thread's stack to stderr), two
    seconds to write it, and no core file."""
    sids = set(sids)
    procs = session_processes(sids, token)
    if faulthandler_first and procs:
        for proc in procs:
            with contextlib.suppress(psutil.Error, OSError):
                proc.rlimit(psutil.RLIMIT_CORE, (0, 0))
                proc.send_signal(signal.SIGABRT)
        psutil.wait_procs(procs, timeout=2.0)
    killed: list[str] = []
    seen: set[int] = set()
    for _ in range(5):  # a process may fork while we kill: repeat until nothing is left
        procs = session_processes(sids, token)
        if not procs:
            break
        for sid in sids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(sid, signal.SIGKILL)
        for proc in procs:
            if proc.pid not in seen:
                seen.add(proc.pid)
                killed.append(describe(proc))
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(procs, timeout=5.0)
    return killed


#: Children that may outlive a test, shared by the whole pytest session: W&B's service process,
#: multiprocessing's resource tracker and forkserver (one each, started on first use), and
#: OpenMPI's singleton daemon `orted`, started once when Lightning's MPI detection imports
#: mpi4py where it is installed (the GPU machine's image): killing it ends the session badly.
SHARED_CHILDREN = ("wandb", "resource_tracker", "forkserver", "orted")


def own_children() -> dict[int, psutil.Process]:
    """This process's live descendants (zombies and shared services left out), by pid."""
    found = {}
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if any(name in " ".join(proc.cmdline()) for name in SHARED_CHILDREN):
                continue
        except psutil.Error:
            continue
        found[proc.pid] = proc
    return found


def reap_children(before: Iterable[int], grace: float = 10.0) -> str:
    """Kill the descendants that appeared since ``before`` and are alive after ``grace`` s.

    Returns "" when none is left; otherwise a failure message describing each one with the
    Python stack of every thread it had (taken before the kill).
    """
    import gc

    known = set(before)
    if not any(pid not in known for pid in own_children()):
        # Most tests start no process: skip the full collection below, which takes 0.3-1 s
        # with torch, Lightning and wandb loaded (it was a third of the suite's time).
        return ""
    gc.collect()  # a DataLoader iterator in a reference cycle: its workers end with it
    new = [p for pid, p in own_children().items() if pid not in known]
    if not new:
        return ""
    _, alive = psutil.wait_procs(new, timeout=grace)
    if not alive:
        return ""
    dump = stacks(alive)
    described = "\n".join(describe(p) for p in alive)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=5.0)
    return f"processes outlived the test (now killed):\n{described}\n{dump}"


def new_token() -> str:
    """A fresh value for ``SPEEDPACK_TEST_SESSION``, unique to one command or DDP run."""
    return f"{os.getpid()}-{time.monotonic_ns()}-{os.urandom(4).hex()}"


def _read(file: IO[str]) -> str:
    file.flush()
    file.seek(0)
    return file.read()


def run_in_session(
    cmd: Sequence[str],
    timeout: float,
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    grace: float = 5.0,
) -> Finished:
    """Run ``cmd`` in a new session; kill all it started on timeout and after it exits.

    Output goes to temporary files, not pipes, so a grandchild that inherited them and outlives
    the command cannot block the read.

    Args:
        cmd: the command line.
        timeout: seconds before everything is killed and :class:`ProcessTimeout` raised.
        env: the environment (default: this process's). ``PYTHONFAULTHANDLER=1`` is added (a
            crash -- or the fallback without py-spy -- prints Python stacks) and a fresh
            ``SPEEDPACK_TEST_SESSION`` token that finds descendants which left the session.
        cwd: the working directory.
        grace: seconds the other processes get to exit after the command did (DataLoader workers
            notice their parent's death within a few seconds); what remains is killed and
            listed in ``leftovers``.

    Raises:
        ProcessTimeout: the deadline passed; the message has the tail of the command's output
            and the stack of every process it had started.
    """
    envs = None if env is None else [env]
    return run_together([cmd], timeout, envs=envs, cwd=cwd, grace=grace)[0]


def run_together(
    cmds: Sequence[Sequence[str]],
    timeout: float,
    *,
    envs: Sequence[Mapping[str, str]] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    grace: float = 5.0,
) -> list[Finished]:
    """Run several commands at once (e.g. two ``torchrun`` nodes), each as :func:`run_in_session`
    does; when the shared deadline passes, all of them are killed and the stacks of all their
    processes go into one :class:`ProcessTimeout`."""
    token = new_token()
    with contextlib.ExitStack() as files:
        started: list[tuple[subprocess.Popen[str], IO[str], IO[str]]] = []
        try:
            for i, command in enumerate(cmds):
                full_env = dict(os.environ if envs is None else envs[i])
                full_env.setdefault("PYTHONFAULTHANDLER", "1")
                full_env[TOKEN_VARIABLE] = token
                out = files.enter_context(tempfile.TemporaryFile("w+"))
                err = files.enter_context(tempfile.TemporaryFile("w+"))
                proc = subprocess.Popen(
                    list(command),
                    stdout=out,
                    stderr=err,
                    text=True,
                    env=full_env,
                    cwd=cwd,
                    start_new_session=True,
                )
                started.append((proc, out, err))
            sids = [proc.pid for proc, _, _ in started]  # a session leader's pid is its session id
            deadline = time.monotonic() + timeout
            for proc, _, _ in started:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            members = session_processes(sids, token)
            dump = stacks(members)
            listing = "\n".join(describe(p) for p in members)
            kill_sessions(sids, token, faulthandler_first=py_spy() is None)
            outputs = []
            for cmd, (popen, stdout, stderr) in zip(cmds, started, strict=False):
                popen.wait()
                outputs.append((" ".join(cmd)[:300], _read(stdout), _read(stderr)))
            tails = "".join(
                f"=== {cmd}\n--- stderr (tail)\n{e[-4000:]}\n--- stdout (tail)\n{o[-2000:]}\n"
                for cmd, o, e in outputs
            )
            raise ProcessTimeout(
                f"did not finish within {timeout:.0f} s; killed {len(members)} processes:\n"
                f"{listing}\n\n=== Python stacks ===\n{dump}\n{tails}",
                stdout="\n".join(o for _, o, _ in outputs),
                stderr="\n".join(e for _, _, e in outputs),
                dump=dump,
            ) from None
        except BaseException:
            kill_sessions([proc.pid for proc, _, _ in started], token)
            for proc, _, _ in started:
                proc.wait()
            raise
        deadline = time.monotonic() + grace
        while session_processes(sids, token) and time.monotonic() < deadline:
            time.sleep(0.2)
        leftovers = kill_sessions(sids, token)
        return [
            Finished(list(cmd), popen.returncode, _read(stdout), _read(stderr), leftovers)
            for cmd, (popen, stdout, stderr) in zip(cmds, started, strict=True)
        ]
