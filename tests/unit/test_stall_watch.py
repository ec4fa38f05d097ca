"""The stall watch: a stage that stops completing steps is named and stopped within the
limit plus 10 s; a slow step under the limit and an idle engine are left alone.

The stages are real processes over gloo with the runner's heartbeat (_stalling_stage.py);
this test plays the engine core: it hands out steps, at most ``pp`` at a time, and takes
each back when the last stage reports it done, as vLLM's batch queue does.
"""

from __future__ import annotations

import collections
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import pytest

from vllm_pp_cudagraph.engine_core import stall_watch
from vllm_pp_cudagraph.engine_core.stall_watch import StallWatch, Verdict, stuck_rank
from vllm_pp_cudagraph.shared.heartbeats import Beat, Phase

STAGE = Path(__file__).with_name("_stalling_stage.py")
LIMIT_S = 3.0
#: What the issue allows beyond the limit for naming and stopping a stuck stage.
BOUND_S = 10.0


def wait_until(condition, timeout_s: float) -> bool:
    """Whether ``condition`` held within ``timeout_s``: every wait here is bounded, so a
    broken watch fails a test instead of hanging the suite."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


class Pipeline:
    """The stage processes, and the steps handed out to them."""

    def __init__(self, directory: Path, scenario: str, pp: int = 2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_PP_CUDAGRAPH_")}
        self.procs = [
            subprocess.Popen([sys.executable, str(STAGE), str(stage), str(pp), str(port),
                              str(directory), scenario, str(LIMIT_S)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
            for stage in range(pp)
        ]
        for proc in self.procs:
            assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        self.queue: collections.deque = collections.deque()
        self.futures: dict[int, Future] = {}
        self.handed_out = 0
        self.last_done_at = time.monotonic()
        threading.Thread(target=self._read_results, daemon=True).start()

    def _read_results(self) -> None:
        for line in self.procs[-1].stdout:
            if line.startswith("done "):
                step = int(line.split()[1])
                self.last_done_at = time.monotonic()
                entry = next(e for e in self.queue if e[1] == step)
                self.queue.remove(entry)
                entry[0].set_result(step)

    def in_flight(self) -> list[tuple]:
        return list(self.queue)

    def hand_out(self, steps: int) -> None:
        """Hand out ``steps`` steps, at most as many at a time as there are stages."""
        for _ in range(steps):
            wait_until(lambda: len(self.queue) < len(self.procs), 2 * LIMIT_S + BOUND_S)
            self.handed_out += 1
            self.queue.appendleft((Future(), self.handed_out))
            for proc in self.procs:
                proc.stdin.write("step\n")
                proc.stdin.flush()

    def close(self) -> list[str]:
        """End every stage; their stderr."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
        return [proc.communicate(timeout=30)[1] for proc in self.procs]


def watching(pipeline: Pipeline, directory: Path, exits: list[int]) -> StallWatch:
    def act(verdict: Verdict, beats: list[Beat]) -> None:
        stall_watch.stop_engine(verdict, beats, exit_process=exits.append)

    return StallWatch(pipeline.in_flight, directory, engine=0, pp_size=len(pipeline.procs),
                      tp_size=1, limit_s=LIMIT_S, act=act, poll_s=0.2).start()


@pytest.mark.parametrize("scenario, phase", [("receive", "between steps (in the worker's "
                                                         "hand-off send or receive"),
                                             ("step", "in its forward pass of step 3")])
def test_a_stuck_stage_is_named_and_stopped_within_the_limit(tmp_path, scenario, phase):
    pipeline = Pipeline(tmp_path, scenario)
    exits: list[int] = []
    watch = watching(pipeline, tmp_path, exits)
    try:
        pipeline.hand_out(4)  # step 3 never comes back
        stuck = pipeline.procs[-1]
        wait_until(lambda: stuck.poll() is not None,
                   pipeline.last_done_at + LIMIT_S + BOUND_S - time.monotonic())
        stopped_after = time.monotonic() - pipeline.last_done_at
        watch.join(stall_watch.DUMP_WAIT_S + stall_watch.STOP_GRACE_S + 5)
    finally:
        watch.stop()
        stderr = pipeline.close()
    assert stuck.returncode == -signal.SIGKILL, f"not stopped in {LIMIT_S + BOUND_S} s"
    assert stopped_after <= LIMIT_S + BOUND_S
    verdict = watch.fired
    assert (verdict.stage, verdict.tp_rank, verdict.beat.pid) == (1, 0, stuck.pid)
    assert phase in verdict.why
    assert scenario != "receive" or "after step 2" in verdict.why
    report = watch.report(verdict, stopped_after)
    assert "pipeline stage 1 (TP rank 0" in report and stall_watch.SETTING in report
    # The stuck stage wrote its threads' stacks before it was killed.
    blocked_in = "recv" if scenario == "receive" else "blocked_forever_in_forward"
    assert blocked_in in stderr[1]
    # The server is left to vLLM, which stops when a worker dies; the engine core would
    # end itself only if it still ran after the grace.
    assert exits == [stall_watch.EXIT_CODE]


def test_a_step_just_under_the_limit_is_not_stopped(tmp_path):
    pipeline = Pipeline(tmp_path, "under")
    exits: list[int] = []
    watch = watching(pipeline, tmp_path, exits)
    try:
        pipeline.hand_out(6)
        wait_until(lambda: not pipeline.queue, 2 * LIMIT_S + BOUND_S)
        time.sleep(1.0)
    finally:
        watch.stop()
        pipeline.close()
    assert not pipeline.queue, "the pipeline did not finish its steps"
    assert watch.fired is None and not exits
    assert all(p.returncode == -signal.SIGKILL for p in pipeline.procs)  # killed by close()


def test_an_idle_engine_is_not_stopped(tmp_path):
    pipeline = Pipeline(tmp_path, "healthy")
    exits: list[int] = []
    watch = watching(pipeline, tmp_path, exits)
    try:
        pipeline.hand_out(2)
        assert wait_until(lambda: not pipeline.queue, BOUND_S)
        time.sleep(LIMIT_S + 2.0)  # nothing in flight, for longer than the limit
        assert all(p.poll() is None for p in pipeline.procs)
        assert watch._thread.is_alive()  # still watching
    finally:
        watch.stop()
        pipeline.close()
    assert watch.longest_s > 0  # it saw the steps go out and come back
    assert watch.fired is None and not exits


def beat(stage: int, tp_rank: int = 0, begun: int = 5, done: int = 5, pid: int = 100,
         phase: Phase = Phase.BETWEEN_STEPS) -> Beat:
    return Beat(pid + 10 * stage + tp_rank, stage, tp_rank, phase, begun, done, 0.0, 0.0, "h")


def running(pid: int) -> str:
    return "S"


def test_the_first_rank_behind_holds_the_pipeline_up():
    # Stage 0 finished step 6 and handed it on; stage 1 is inside it; stage 2 waits for it.
    beats = [beat(0, done=6, begun=6), beat(1, begun=6), beat(2)]
    assert stuck_rank(beats, 3, 1, 10.0, running).stage == 1
    # Nobody finished step 6: the first stage holds it.
    beats = [beat(0, begun=6, phase=Phase.FORWARD), beat(1), beat(2)]
    assert stuck_rank(beats, 3, 1, 10.0, running).stage == 0


def test_a_tp_peer_that_never_began_the_step_is_named_before_the_one_waiting_in_it():
    beats = [beat(0, 0, begun=6, phase=Phase.FORWARD), beat(0, 1)]
    verdict = stuck_rank(beats, 1, 2, 10.0, running)
    assert (verdict.stage, verdict.tp_rank) == (0, 1)


def test_a_stopped_process_is_named_first():
    beats = [beat(0, begun=6, phase=Phase.FORWARD), beat(1)]
    verdict = stuck_rank(beats, 2, 1, 10.0, lambda pid: "T" if pid == 110 else "S")
    assert verdict.stage == 1 and "stopped by a signal" in verdict.why


def test_stages_on_other_hosts_are_said_to_be_unseen():
    verdict = stuck_rank([beat(0), beat(1)], 4, 1, 10.0, running)
    assert "stages [2, 3] run on other hosts" in verdict.why


def test_the_limit_grows_with_the_longest_step_seen():
    watch = StallWatch(lambda: [], Path("."), 0, 2, 1, limit_s=60.0)
    assert watch.limit() == 60.0
    watch.longest_s = 30.0
    assert watch.limit() == stall_watch.LONGEST_STEP_FACTOR * 30.0


def test_stopping_kills_the_stuck_stage_and_dumps_the_stacks_that_can_be_dumped():
    beats = [beat(0, tp_rank=0), beat(0, tp_rank=1), beat(1)]
    for why, dumped in (("in its forward pass of step 6", [110]),
                        ("its process is stopped by a signal (state T)", [100, 101])):
        sent: list[tuple[int, int]] = []
        exits: list[int] = []
        stall_watch.stop_engine(Verdict(1, 0, beats[2], why), beats,
                                send=lambda pid, sig: sent.append((pid, sig)),
                                sleep=lambda s: None, exit_process=exits.append)
        assert [pid for pid, sig in sent if sig == stall_watch.STACKS_SIGNAL] == dumped
        assert [pid for pid, sig in sent if sig == signal.SIGKILL] == [110]
        assert exits == [stall_watch.EXIT_CODE]
