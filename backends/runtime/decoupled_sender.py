"""The one place where a decoupled model's stream of responses is sent and closed.

Every request of a decoupled model gets exactly one final response (flag COMPLETE_FINAL), whichever thread
answers it and whatever goes wrong. `StreamSender` wraps the request's response sender: `send` streams a partial
response, `finish` and `fail` close the stream, and anything after the close is dropped (a cancelled request
or an error met after a partial answer must not send a second final response). Thread-safe.

`pb_utils` is handed in, so this module imports nothing from Triton (the stub provides it at run time).
"""
from __future__ import annotations

import queue
import threading
import traceback
from typing import Callable

from s2t.backends.runtime.serving_errors import ServingError, triton_error


class StreamSender:
    def __init__(self, response_sender, pb_utils):
        self._sender = response_sender
        self._pb = pb_utils
        self._lock = threading.Lock()
        self._closed = False

    def send(self, tensors: list) -> bool:
        """A partial response; False when the stream is already closed."""
        with self._lock:
            if self._closed:
                return False
            self._sender.send(self._pb.InferenceResponse(output_tensors=tensors))
            return True

    def finish(self, tensors: list | None = None) -> bool:
        """The final response, with `tensors` or none; False when the stream was already closed."""
        with self._lock:
            if self._closed:
                return False
            self._closed = True
            if tensors:
                self._sender.send(self._pb.InferenceResponse(output_tensors=tensors),
                                  flags=self._pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                self._sender.send(flags=self._pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return True

    def fail(self, message: str, code) -> bool:
        """A final error response; a new TritonError each time (a shared one crashes Triton 2.51's server)."""
        return self._final_error(lambda: self._pb.TritonError(message, code))

    def refuse(self, err: ServingError) -> bool:
        """A final error response saying `err`, with the Triton code of its kind
        (backends/runtime/serving_errors.py)."""
        return self._final_error(lambda: triton_error(err, self._pb.TritonError))

    def _final_error(self, new_error: Callable[[], object]) -> bool:
        with self._lock:
            if self._closed:
                return False
            self._closed = True
            self._sender.send(self._pb.InferenceResponse(error=new_error()),
                              flags=self._pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return True


class Outbox:
    """Talks to Triton for a decoupled model one task at a time: responses and metric updates are queued as tasks
    and run in order by its thread. Triton 2.51's python backend aborts the server
    (boost::interprocess::lock_exception) when several threads send decoupled responses at once.

    `run_or_put` runs a task on the caller's thread instead while the outbox has nothing queued or running: a
    token produced on an engine's thread is then sent without a hand-over to the outbox's thread (a wake-up and a
    switch per token, on cores the engine itself needs). Whoever runs a task holds `_talking`, so tasks still
    never run at once, and one queued earlier always runs first."""

    def __init__(self, log: Callable[[str], None], name: str):
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._log = log
        self._talking = threading.Lock()
        # Tasks put and not yet run to their end; changed under _counting.
        self._pending = 0
        self._counting = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def put(self, task: Callable[[], object]) -> None:
        with self._counting:
            self._pending += 1
        self._tasks.put(task)

    def run_or_put(self, task: Callable[[], object]) -> None:
        """`task` run now on this thread when no task is queued or running, else queued behind them."""
        if not self._talking.acquire(blocking=False):
            self.put(task)
            return
        try:
            if self._pending:
                self.put(task)
                return
            self._run(task)
        finally:
            self._talking.release()

    def close(self, timeout: float = 5.0) -> None:
        """Runs what is queued, then stops."""
        self._tasks.put(None)
        self._thread.join(timeout=timeout)

    def _run(self, task: Callable[[], object]) -> None:
        try:
            task()
        except Exception:  # noqa: BLE001 - one failed send must not stop the others
            self._log(traceback.format_exc())

    def _loop(self) -> None:
        while (task := self._tasks.get()) is not None:
            with self._talking:
                self._run(task)
                with self._counting:
                    self._pending -= 1
