"""A decoupled python model's `execute`: a whole call taken in at once (`take_in`) or each request with its own
StreamSender (`each_stream`), every request answered even when the handler fails, sent through the model's outbox one at a time."""
from __future__ import annotations

import functools
import traceback
from typing import Any, Callable

from s2t.backends.runtime import fault_points
from s2t.backends.runtime.decoupled_sender import Outbox, StreamSender
from s2t.backends.runtime.serving_errors import InternalError, ServingError


class DecoupledExecute:
    """Glue's decoupled serving (it gives `pb`, `name`, `shown_as` and `_failed`)."""

    def take_in(self, requests, take: Callable[[list], Any]) -> tuple[bool, Any]:
        """For a decoupled model: `take(senders)` with the fault point; if it fails, before any record was taken in,
        every request gets an INTERNAL error as its final response. (taken, take's result)."""
        senders = [r.get_response_sender() for r in requests]
        try:
            fault_points.check(f"{self.name}.execute")
            return True, take(senders)
        except Exception:  # noqa: BLE001 - log it, answer every request, keep serving
            for sender, response in zip(senders, self._failed(requests)):
                sender.send(response, flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return False, None

    def send(self, sender, response, final: bool) -> None:
        sender.send(response, flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0)

    def outbox(self) -> Outbox:
        """What sends a decoupled model's responses, one task at a time (Triton 2.51 aborts the server when several
        threads send at once)."""
        return Outbox(self.pb.Logger.log_error, f"{self.name}-outbox")

    def each_stream(self, refuse: Callable[[Any, StreamSender, ServingError], None]) -> Callable:
        """`handle(self, request, sender)` served as a decoupled model's `execute`: each request of the call with
        its own StreamSender, which `handle` (or the work it starts) closes. A ServingError raised for a request is
        its answer, given to `refuse(self, sender, err)` (the model sends it from its outbox and counts it); any
        other exception, the fault point included, is logged and refused as INTERNAL without the details. Either
        way the next request is still taken."""
        point = f"{self.name}.execute"

        def wrap(handle: Callable) -> Callable:
            @functools.wraps(handle)
            def execute(model, requests):
                for request in requests:
                    sender = StreamSender(request.get_response_sender(), self.pb)
                    try:
                        fault_points.check(point)
                        handle(model, request, sender)
                    except ServingError as err:
                        refuse(model, sender, err)
                    except Exception:  # noqa: BLE001 - log it, refuse this request alone, keep serving
                        self.pb.Logger.log_error(traceback.format_exc())
                        refuse(model, sender, InternalError(f"{self.shown_as}: internal error"))
                return None
            return execute
        return wrap
