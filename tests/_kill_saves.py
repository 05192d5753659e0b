"""Saves killed with SIGKILL at chosen points, for test_save_load.py and the soak.

``python tests/_kill_saves.py PATH`` is a fork server: it imports mlaxgraph once
(without starting JAX's backend, so forking is safe), then reads kill points from
stdin, one a line: ``SAVES STAGE BYTES``. For each it forks a child that saves version
after version of a 4 MiB model to PATH and, during its save number SAVES, kills itself
with SIGKILL at STAGE:

- ``write``: once BYTES bytes of the new file are written (the write that crosses
  BYTES writes only up to it; a negative BYTES counts from the end of the file, whose
  size is the same for every version);
- ``fsync``: before the new file is fsync'ed;
- ``replace``: before it is renamed over PATH;
- ``dir_fsync``: after the rename, before the directory is fsync'ed.

The kill is the process's own, at a point fixed by the bytes and calls made, not by
time, so a trial gives the same result on an idle machine and a busy one. The server
answers ``result VERSION KILLED`` where VERSION is the version of the save killed.

``run_trials`` drives it and checks, after each kill, that PATH loads exactly as one
whole version: the one killed when the rename had happened, else the one before it.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STAGES = ("write", "fsync", "replace", "dir_fsync")


def graph():
    import mlaxgraph as mg
    from mlaxgraph import ops

    x = mg.Input(("batch", 512), name="x")
    return mg.Graph(x, ops.Linear(2048, name="big")(x), name="big")


def content(version: int) -> dict:
    return {"big": {"kernel": np.full((512, 2048), version, np.float32),
                    "bias": np.full((2048,), version, np.float32)}}


class _Counting:
    """A file whose writes are counted; the write that reaches the kill point writes
    up to it and kills the process."""

    def __init__(self, f, kill_at):
        self._f, self._kill_at, self._written = f, kill_at, 0

    def write(self, data):
        data = memoryview(data).cast("B")
        if self._kill_at is not None and self._written + len(data) >= self._kill_at:
            self._f.write(data[:self._kill_at - self._written])
            self._f.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        self._written += len(data)
        return self._f.write(data)

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self._f.__exit__(*exc)


def _child(path: str, first_version: int, saves: int, stage: str, kill_bytes: int) -> None:
    import mlaxgraph as mg
    from mlaxgraph.io import weights

    g = graph()
    current = {"save": 0}
    if kill_bytes < 0:
        kill_bytes += os.path.getsize(path)

    def at(name):
        if current["save"] == saves and stage == name:
            os.kill(os.getpid(), signal.SIGKILL)

    fdopen, fsync, replace = os.fdopen, os.fsync, os.replace

    def counting_fdopen(fd, *args, **kwargs):
        f = fdopen(fd, *args, **kwargs)
        return _Counting(f, kill_bytes if current["save"] == saves and stage == "write" else None)

    def hooked_fsync(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            at("dir_fsync")
        else:
            at("fsync")
        return fsync(fd)

    def hooked_replace(src, dst):
        at("replace")
        return replace(src, dst)

    weights.os.fdopen, weights.os.fsync, weights.os.replace = counting_fdopen, hooked_fsync, hooked_replace
    for i in range(saves):
        current["save"] = i + 1
        mg.save(path, g, content(first_version + i), {})


def serve(path: str) -> None:
    import mlaxgraph  # noqa: F401 - imported once, before forking

    print("ready", flush=True)
    trial = 0
    for line in sys.stdin:
        saves, stage, kill_bytes = line.split()
        trial += 1
        first = trial * 1000 + 1
        pid = os.fork()
        if pid == 0:
            try:
                _child(path, first, int(saves), stage, int(kill_bytes))
            finally:
                os._exit(3)  # reached only when no kill point was met
        _, status = os.waitpid(pid, 0)
        killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        print("result", first + int(saves) - 1, int(killed), flush=True)


def run_trials(path, points, on_result=None) -> dict:
    """Saves version 0 to ``path``, runs the kill points ``(saves, stage, bytes)`` and
    checks the file after each; returns counts. ``on_result(point, version)`` sees
    each trial."""
    import mlaxgraph as mg

    path = os.fspath(path)
    g = graph()
    mg.save(path, g, content(0))
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "JAX_PLATFORMS": "cpu"}
    server = subprocess.Popen([sys.executable, os.path.abspath(__file__), path], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env, cwd=os.path.dirname(path))
    previous, counts = 0, {"trials": 0, "replaced": 0, "kept": 0}
    try:
        assert server.stdout.readline().strip() == "ready"
        for saves, stage, kill_bytes in points:
            server.stdin.write(f"{saves} {stage} {kill_bytes}\n")
            server.stdin.flush()
            fields = server.stdout.readline().split()
            assert fields[:1] == ["result"], fields
            killed_version, killed = int(fields[1]), fields[2] == "1"
            assert killed, f"{(saves, stage, kill_bytes)}: the saver was not killed at its kill point"
            loaded_graph, params, state = mg.load(path)
            version = int(params["big"]["bias"][0])
            assert loaded_graph == g and state == {}
            want = content(version)["big"]
            assert np.array_equal(np.asarray(params["big"]["kernel"]), want["kernel"])
            assert np.array_equal(np.asarray(params["big"]["bias"]), want["bias"])
            renamed = stage == "dir_fsync"
            expected = killed_version if renamed else (killed_version - 1 if saves > 1 else previous)
            assert version == expected, (f"{(saves, stage, kill_bytes)}: the file holds version "
                                         f"{version}, expected {expected}")
            counts["trials"] += 1
            counts["replaced" if version != previous else "kept"] += 1
            if on_result is not None:
                on_result((saves, stage, kill_bytes), version)
            previous = version
    finally:
        server.stdin.close()
        server.wait(timeout=60)
    assert server.returncode == 0
    return counts


if __name__ == "__main__":
    serve(sys.argv[1])
