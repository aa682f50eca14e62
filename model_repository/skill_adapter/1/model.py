"""skill_adapter: legacy JSON records -> the scorer's packed inputs; a bad record fails its request alone."""
import triton_python_backend_utils as pb_utils

from s2t.backends.records.feature_spec import FeatureSpec
from s2t.backends.records.record_decoder import AdapterSettings, RecordDecoder
from s2t.backends.runtime.triton_glue import Glue, ModelArgs, Rows
from s2t.wire.names import CATEGORICAL, NUMERIC, PAYLOAD

SETTINGS = AdapterSettings
glue = Glue(pb_utils, "skill_adapter")


class TritonPythonModel:
    def initialize(self, args):
        model = ModelArgs.of(args)
        settings = glue.settings(SETTINGS, model)
        spec = FeatureSpec.from_file(settings.feature_spec)
        self._decoder = RecordDecoder(spec, settings.max_record_bytes)
        outputs = {o["name"]: o["dims"] for o in model.config["output"]}
        expected = {"categorical": [len(spec.categorical)], "numeric": [len(spec.numeric)]}
        for name, dims in expected.items():
            if [int(d) for d in outputs.get(name, [])] != dims:
                raise ValueError(f"output {name} must have dims {dims} to match {settings.feature_spec}, "
                                 f"config says {outputs.get(name)}")

    def finalize(self):
        glue.finalize(self)

    @glue.batch(PAYLOAD, ravel=True)
    def execute(self, payloads):
        decoded = self._decoder.decode(payloads)
        return Rows({CATEGORICAL: decoded.categorical, NUMERIC: decoded.numeric}, decoded.errors)
