"""llm_router: each new generation to the primary version of `llm` or, for the canary share, to the candidate.

The split and the relay are backends/llm/version_routing.py; each stream is a streaming BLS call to the chosen
version,
relayed on a worker thread of its own and sent to Triton from one outbox thread (as in `llm`).
"""
from concurrent.futures import ThreadPoolExecutor

import triton_python_backend_utils as pb_utils

from s2t.backends.llm.version_routing import LlmRouterSettings, RelaySlots, Splitter, relay
from s2t.backends.runtime.triton_glue import Glue, ModelArgs

SETTINGS = LlmRouterSettings
# llm's outputs, passed on; served_by (model:version) is added to each response.
OUTPUTS = ("text_output", "input_tokens", "output_tokens", "finish_reason")
glue = Glue(pb_utils, "llm_router")


class TritonPythonModel:
    def initialize(self, args):
        model = ModelArgs.of(args)
        glue.require_decoupled(model, "relays token streams")
        settings = glue.settings(SETTINGS, model)
        self._splitter = Splitter(settings.routing)
        self._slots = RelaySlots(settings.max_streams)
        self._outbox = glue.outbox()
        self._workers = ThreadPoolExecutor(settings.max_streams, thread_name_prefix="llm-router")

    def _refuse(self, sender, err):
        self._outbox.put(lambda: sender.refuse(err))

    @glue.each_stream(refuse=_refuse)
    def execute(self, request, sender):
        self._slots.take()  # a ServingError (every relay slot held) refuses this request alone
        try:
            # Copies: the request's own tensors are not kept past execute.
            inputs = {t.name(): t.as_numpy().copy() for t in request.inputs()}
            target = self._splitter.target(request.request_id(), self._ready)
            self._workers.submit(self._relay, request, inputs, sender, target)
        except BaseException:
            self._slots.release()
            raise

    def _ready(self, target) -> bool:
        return pb_utils.is_model_ready(target.model, str(target.version or ""))

    def _relay(self, request, inputs, sender, target):
        put = self._outbox.put
        try:
            relay(_pieces(glue.stream(target.model, inputs, OUTPUTS, target.version or -1)), str(target),
                  send=lambda outputs: put(lambda: sender.send(_tensors(outputs))),
                  finish=lambda outputs: put(lambda: sender.finish(_tensors(outputs or {}))),
                  fail=lambda err: put(lambda: sender.refuse(err)),
                  cancelled=request.is_cancelled)
        finally:
            self._slots.release()

    def finalize(self):
        self._workers.shutdown(wait=True)
        self._outbox.close()
        glue.finalize(self)


def _pieces(responses):
    """Each response's outputs by name; one without any (a bare final flag) is skipped."""
    for arrays in responses:
        outputs = {name: array for name, array in zip(OUTPUTS, arrays) if array is not None}
        if outputs:
            yield outputs


def _tensors(outputs):
    return [pb_utils.Tensor(name, array) for name, array in outputs.items()]
