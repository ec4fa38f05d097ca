"""A worker's reply awaited over the network ends when the executor shuts its queues down.

vLLM's real ``MessageQueue`` with one reader on "another node" (a zmq socket on the
loopback address, as a Ray worker on a second node gets), the way the executor's
monitor stops it when that worker dies: ``shutdown()`` from another thread while the
engine core's step waits in ``dequeue``.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch
from vllm.distributed.device_communicators.shm_broadcast import MessageQueue

from vllm_pp_cudagraph import patches
from vllm_pp_cudagraph.engine_core.remote_reply import CANCELLED
from vllm_pp_cudagraph.shared.settings import PPCudaGraphSettings


@pytest.fixture
def patched():
    undo = patches.apply_patch("remote-reply", PPCudaGraphSettings())
    assert undo is not None
    yield
    undo()


@pytest.fixture
def queue_pair():
    """A writer (a worker's reply queue) and its one reader on another node."""
    writer = MessageQueue(n_reader=1, n_local_reader=0, connect_ip="127.0.0.1")
    reader = MessageQueue.create_from_handle(writer.export_handle(), rank=0)
    ready = threading.Thread(target=writer.wait_until_ready, daemon=True)
    ready.start()
    reader.wait_until_ready()
    ready.join(timeout=10)
    assert reader._is_remote_reader and not ready.is_alive()
    yield writer, reader
    # Closed here, without lingering: a zmq context collected with an open socket can
    # block the interpreter's exit (vLLM 0.26's queues leave them open).
    for queue in (writer, reader):
        if queue.remote_socket is not None:
            queue.remote_socket.close(linger=0)


def dequeue_in_thread(reader: MessageQueue, timeout: float | None = None):
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["value"] = reader.dequeue(timeout=timeout)
        except BaseException as error:  # noqa: BLE001 - the test inspects it
            outcome["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def test_a_reply_awaited_from_another_node_ends_when_the_queue_shuts_down(patched, queue_pair):
    writer, reader = queue_pair
    thread, outcome = dequeue_in_thread(reader)
    time.sleep(0.3)
    reader.shutdown()
    thread.join(timeout=5)
    if thread.is_alive():
        writer.enqueue("release")  # let the stuck reader go before failing
        thread.join(timeout=5)
        pytest.fail("the reader still waited for the reply 5 s after its queue shut down")
    error = outcome.get("error")
    assert isinstance(error, RuntimeError) and str(error) == CANCELLED


def test_replies_from_another_node_still_arrive_whole_and_in_order(patched, queue_pair):
    writer, reader = queue_pair
    big = torch.arange(600_000, dtype=torch.float32)  # 2.4 MB: sent out of band
    thread, outcome = dequeue_in_thread(reader)
    time.sleep(0.7)  # longer than one poll slice: the reply arrives mid-wait
    writer.enqueue(("SUCCESS", big))
    thread.join(timeout=5)
    status, tensor = outcome["value"]
    assert status == "SUCCESS" and torch.equal(tensor, big)
    writer.enqueue(("SUCCESS", 2))
    assert reader.dequeue() == ("SUCCESS", 2)


def test_a_remote_reply_that_never_comes_still_times_out_at_the_callers_deadline(
        patched, queue_pair):
    _, reader = queue_pair
    start = time.monotonic()
    thread, outcome = dequeue_in_thread(reader, timeout=1.2)
    thread.join(timeout=10)  # a broken deadline fails here instead of stopping the suite
    assert not thread.is_alive(), "dequeue ignored the caller's deadline"
    assert isinstance(outcome.get("error"), TimeoutError)
    assert 1.1 < time.monotonic() - start < 3.0


def test_the_patch_undoes_to_vllms_own_dequeue():
    own = MessageQueue.__dict__["dequeue"]
    undo = patches.apply_patch("remote-reply", PPCudaGraphSettings())
    assert MessageQueue.dequeue is not own
    undo()
    assert MessageQueue.__dict__["dequeue"] is own


def test_where_vllms_queue_cannot_shut_down_the_patch_stands_aside(monkeypatch):
    """Without ``shutdown`` nothing would ever end the wait the patch makes cancellable,
    so it leaves vLLM's own ``dequeue`` (and its timeout) in place and says why."""
    own = MessageQueue.__dict__["dequeue"]
    monkeypatch.setattr(MessageQueue, "shutdown", None, raising=False)
    reason = dict((p.name, why) for p, why in patches.standing(PPCudaGraphSettings()))
    assert "cannot be shut down" in (reason["remote-reply"] or "")
    assert patches.apply_patch("remote-reply", PPCudaGraphSettings()) is None
    assert MessageQueue.__dict__["dequeue"] is own
