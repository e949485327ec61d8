"""The command's quiet resource tracker (``mmbatch.lifetime.quiet_resource_tracker``): what a
process leaves in shared memory is still unlinked once it is gone, without a warning on the
user's terminal; a process that did not ask for it keeps the tracker as Python starts it.
And a Ray actor's (``orphan_resource_tracker``): it outlives the actor's children, which Ray
kills as it ends the actor, and unlinks what they left. And what a forked child keeps of its
parent's (``KeptPerProcess``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

LEAVE_A_SEGMENT = textwrap.dedent(
    """
    import os, sys
    from multiprocessing import shared_memory
    if sys.argv[1] == "quiet":
        from mmbatch.lifetime import quiet_resource_tracker
        quiet_resource_tracker()
    segment = shared_memory.SharedMemory(create=True, size=4096)
    print(segment.name, flush=True)
    os._exit(0)  # as a process ended by SIGKILL: nothing of its own is unlinked
    """
)


def leave_a_segment(mode: str) -> tuple[str, str]:
    """Run a process that leaves a shared memory segment behind; its name, and the stderr
    of the process and of its resource tracker (which outlives it briefly)."""
    proc = subprocess.run(
        [sys.executable, "-c", LEAVE_A_SEGMENT, mode],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip(), proc.stderr


def gone(name: str, within: float = 60.0) -> bool:
    """Whether the segment ``name`` is unlinked within ``within`` seconds (the quiet
    tracker's stderr is not the test's pipe: it may still be at work when the run ends)."""
    deadline = time.monotonic() + within
    while os.path.exists(f"/dev/shm/{name.lstrip('/')}"):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="POSIX shared memory in /dev/shm")
def test_the_quiet_tracker_unlinks_what_a_process_left_without_a_word() -> None:
    name, stderr = leave_a_segment("quiet")
    assert "leaked" not in stderr
    assert gone(name)


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="POSIX shared memory in /dev/shm")
def test_without_it_the_tracker_unlinks_and_warns() -> None:
    """What ``mmbatch`` spares its user's terminal (and what a library caller still sees)."""
    name, stderr = leave_a_segment("plain")
    assert "leaked shared_memory" in stderr
    assert gone(name)


KILLED_WITH_ITS_CHILDREN = textwrap.dedent(
    """
    import multiprocessing, os, signal, sys
    from multiprocessing import shared_memory

    def hold(conn):
        segment = shared_memory.SharedMemory(create=True, size=4096)
        conn.send(segment.name)
        conn.recv()  # held until killed

    if __name__ == "__main__":
        if sys.argv[1] == "orphan":
            from mmbatch.lifetime import orphan_resource_tracker
            orphan_resource_tracker()
        context = multiprocessing.get_context("spawn")
        mine, theirs = context.Pipe()
        child = context.Process(target=hold, args=(theirs,))  # as vLLM's engine core
        child.start()
        print(mine.recv(), flush=True)
        # As a Ray worker ends: every direct child killed, then the worker gone.
        for pid in os.listdir("/proc"):
            try:
                with open(f"/proc/{pid}/stat") as stat:
                    parent = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError):
                continue
            if parent == os.getpid():
                os.kill(int(pid), signal.SIGKILL)
        child.join()
        os._exit(0)
    """
)


def killed_with_its_children(mode: str, folder: Path) -> str:
    """Run a process that spawns a child holding a shared memory segment, then kills its
    direct children and exits, as a Ray actor ends; the segment's name."""
    script = folder / "worker.py"
    script.write_text(KILLED_WITH_ITS_CHILDREN)
    proc = subprocess.run(
        [sys.executable, str(script), mode], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="POSIX shared memory in /dev/shm")
def test_the_orphan_tracker_unlinks_what_children_killed_with_their_parent_left(
    tmp_path: Path,
) -> None:
    name = killed_with_its_children("orphan", tmp_path)
    assert gone(name)


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="POSIX shared memory in /dev/shm")
def test_the_default_tracker_is_killed_with_them_and_the_segment_stays(tmp_path: Path) -> None:
    """What a Ray actor left before: 160 MB of vLLM's per actor, until the host restarts."""
    name = killed_with_its_children("plain", tmp_path)
    try:
        assert not gone(name, within=1.0)
    finally:
        Path(f"/dev/shm/{name.lstrip('/')}").unlink(missing_ok=True)


def test_a_forked_child_starts_with_its_own_empty_container_and_a_free_lock() -> None:
    """A child forked while one of the parent's threads holds the lock (a pipeline starting,
    say) finds the container empty and takes the lock at once: the parent's copy would stay
    held for ever, its holder not being in the child. The parent's are as they were."""
    from mmbatch.lifetime import KeptPerProcess

    kept = KeptPerProcess({1: "the parent's"})
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with kept.locked():
            held.set()
            release.wait(60)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert held.wait(60)
    child = os.fork()
    if child == 0:
        code = 3
        try:
            signal.alarm(20)  # a lock that stays held ends the child (SIGALRM)
            with kept.locked() as seen:
                code = 0 if seen == {} else 1
        finally:
            os._exit(code)
    try:
        _, status = os.waitpid(child, 0)
    finally:
        release.set()
        holder.join(60)
    assert os.waitstatus_to_exitcode(status) == 0
    with kept.locked() as seen:
        assert seen == {1: "the parent's"}


STOPPED_WHILE_STARTING = textwrap.dedent(
    """
    import os, signal, sys, threading, time
    from mmbatch.lifetime import ctrl_c_left_to_the_job

    sig = signal.SIGINT if sys.argv[1] == "int" else signal.SIGTERM
    if sig == signal.SIGTERM:
        def stop(signum, frame):
            print("after: stopped", flush=True)
            raise SystemExit(3)
        signal.signal(signal.SIGTERM, stop)
    # The job's other threads: one of them catches the signal the starting thread blocks.
    threading.Thread(target=threading.Event().wait, daemon=True).start()
    try:
        with ctrl_c_left_to_the_job():
            threading.Thread(target=os.kill, args=(os.getpid(), sig)).start()
            end = time.monotonic() + 0.5
            while time.monotonic() < end:  # Python code, where a handler would run
                pass
            print("inside: not interrupted", flush=True)
    except KeyboardInterrupt:
        print("after: KeyboardInterrupt", flush=True)
    print("handler back:", signal.getsignal(signal.SIGINT) is signal.default_int_handler)
    """
)


@pytest.mark.parametrize("which", ["int", "term"])
def test_a_signal_for_the_job_while_a_helper_starts_is_taken_once_the_start_is_over(
    which: str,
) -> None:
    """Ctrl-C (or SIGTERM) caught by another of the job's threads while the main thread
    starts a helper is raised in the main thread only as the start ends: raised inside it,
    between the helper's exec and the job writing it what to run, it left the helper
    reading an empty pipe and printing its traceback on the terminal. The job's handlers
    are back afterwards."""
    done = subprocess.run(
        [sys.executable, "-c", STOPPED_WHILE_STARTING, which],
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = done.stdout.splitlines()
    if which == "int":
        assert lines == [
            "inside: not interrupted",
            "after: KeyboardInterrupt",
            "handler back: True",
        ]
        assert done.returncode == 0, done.stderr
    else:
        assert lines == ["inside: not interrupted", "after: stopped"]
        assert done.returncode == 3, done.stderr
