"""`s2t drift`: the references risk_router compares live records with (the training data, and each published
version's scores on the gate's data), and the live figures read back from the metrics port."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from s2t.atomic_files import write_atomically
from s2t.backends.routing.drift_watch import DRIFT, NOT_ENOUGH_DATA, NO_DRIFT, TOP_BINS, Reference
from s2t.backends.records.record_decoder import DEFAULT_MAX_RECORD_BYTES, RecordDecoder, encode_columns
from s2t.errors import S2TError
from s2t.prometheus_text import parse_metrics, scrape

REFERENCE_FILE = "drift_reference.json"
# Every series risk_router's drift watch publishes starts so.
DRIFT_SERIES_PREFIX = "s2t_feature_"
PER_FEATURE = {"s2t_feature_psi": "psi", "s2t_feature_psi_noise": "noise_psi", "s2t_feature_drift_sample": "sample",
               "s2t_feature_drift_min_sample": "min_sample", "s2t_feature_drifted": "drifted"}


def build_reference(data_csv: Path, onnx_model: Path, out: Path, source: str | None = None) -> Reference:
    """Encode the data as the adapter does, score it with the model, count both over the drift bins."""
    import onnx
    import onnxruntime as ort

    from s2t.gate import example_parity
    from s2t.models import dataset
    from s2t.models.convert import read_spec

    model = onnx.load(str(onnx_model), load_external_data=False)
    spec = read_spec(model)
    if example_parity.example_input(model) is not None:
        categorical, numeric = _example_columns(data_csv, spec)
    else:
        categorical, numeric = encode_columns(spec, dataset.load(data_csv).columns)
    session = ort.InferenceSession(str(onnx_model), providers=["CPUExecutionProvider"])
    scores = session.run(["probability"], {"categorical": categorical, "numeric": numeric})[0]
    reference = Reference.build(spec, categorical, numeric, np.asarray(scores),
                                source=source or f"{Path(data_csv).name} scored by {Path(onnx_model).name}")
    write_atomically(out, reference.to_json() + "\n")
    return reference


def _example_columns(data_csv: Path, spec) -> tuple[np.ndarray, np.ndarray]:
    """A tf.Example model's data as parity reads it (empty cells take the parse default, features of several values
    are one cell), decoded as the adapter decodes it; the rows the model refuses are not part of the reference."""
    from s2t.gate import example_parity

    rows = [row.example for row in example_parity.examples_from_csv(Path(data_csv), spec) if row.example]
    decoded = RecordDecoder(spec, max_record_bytes=max([DEFAULT_MAX_RECORD_BYTES, *map(len, rows)])).decode(rows)
    kept = np.array([error is None for error in decoded.errors], dtype=bool)
    if not kept.any():
        raise ValueError(f"none of the {len(rows)} rows of {data_csv} can be scored: no drift reference from it")
    return decoded.categorical[kept], decoded.numeric[kept]


def write_version_reference(model: str, version: int, model_file: Path, data_csv: Path) -> Path | None:
    """The version's own reference, beside its model file, from the data its parity gate ran on: risk_router
    compares the version's scores with it while that version is primary. None for a model file that is not ONNX
    (nothing to score it with here); the router then keeps the training reference."""
    model_file = Path(model_file)
    if model_file.suffix != ".onnx":
        return None
    out = model_file.parent / REFERENCE_FILE
    build_reference(data_csv, model_file, out, source=f"{model}:{version} scores of {Path(data_csv).name}")
    return out


class NoDriftSeries(S2TError):
    """The page read has no drift series: not Triton's metrics page, or no risk_router with a reference behind it."""


def metrics_address(address: str) -> str:
    """HOST:PORT (as every address in the CLI) or a URL: the URL of the metrics page; an address or URL without a
    path means Triton's metrics page, `/metrics`."""
    url = address if "://" in address else f"http://{address}"
    scheme, _, rest = url.partition("://")
    host, slash, path = rest.partition("/")
    return f"{scheme}://{host}/{path}" if slash and path else f"{scheme}://{host}/metrics"


def live_report(metrics_text_or_url: str) -> dict:
    """What risk_router publishes: the reference, the window, and each series' figure with its top moved bins.
    A page read from a URL without any drift series is an error naming the URL (NoDriftSeries)."""
    url = None if "\n" in metrics_text_or_url else metrics_address(metrics_text_or_url)
    metrics = parse_metrics(metrics_text_or_url) if url is None else scrape(url)
    if url is not None and not any(name.startswith(DRIFT_SERIES_PREFIX) for name, _ in metrics):
        raise NoDriftSeries(f"{url} has no {DRIFT_SERIES_PREFIX}* series: it is not Triton's metrics page "
                            "(--metrics-url HOST:PORT of Triton's metrics port), or risk_router is not loaded there "
                            "or has no drift reference")
    report: dict = {"reference": None, "reference_version": None, "window_records": None, "sampled_records": 0,
                    "features": {}}
    shares: dict[str, dict[str, dict[str, float]]] = {}
    for (name, labels), value in metrics.items():
        labels = dict(labels)
        if name == "s2t_feature_drift_reference_version":
            report["reference_version"] = int(value)
            report["reference"] = (f"version {int(value)}'s own: its scores on its parity gate's data" if value
                                   else "the training data (risk_router/1/drift_reference.json, scored by the "
                                        "model `make` built)")
        elif name == "s2t_feature_drift_window_records":
            report["window_records"] = int(value)
        elif name == "s2t_feature_drift_sampled_records":
            report["sampled_records"] = int(value)
        elif name in PER_FEATURE:
            figure = report["features"].setdefault(labels["feature"], {})
            figure[PER_FEATURE[name]] = None if math.isnan(value) else value
        elif name == "s2t_feature_bin_share":
            shares.setdefault(labels["feature"], {}).setdefault(labels["bin"], {})[labels["side"]] = value
    for feature, figure in report["features"].items():
        figure["sample"], figure["min_sample"] = int(figure.get("sample") or 0), int(figure.get("min_sample") or 0)
        figure["state"] = (NOT_ENOUGH_DATA if figure["sample"] < figure["min_sample"] or figure.get("psi") is None
                           else DRIFT if figure.pop("drifted", 0) == 1 else NO_DRIFT)
        figure.pop("drifted", None)
        bins = [{"bin": label, "reference_share": s.get("reference", 0.0), "live_share": s.get("live", 0.0)}
                for label, s in shares.get(feature, {}).items()]
        bins.sort(key=lambda b: -abs(b["live_share"] - b["reference_share"]))
        figure["top_bins"] = bins[:TOP_BINS] if figure["state"] != NOT_ENOUGH_DATA else []
    return report


def table(report: dict) -> str:
    features = report["features"]
    if not features:
        return "no s2t_feature_psi metrics: risk_router has no drift reference, or is not loaded"
    lines = [f"reference: {report['reference']}",
             f"window: the last {report['window_records']} records routed ({report['sampled_records']} sampled "
             "since the router started); drift = PSI over both its noise level and the alert level"]
    width = max(len(name) for name in features)
    lines.append(f"{'feature':<{width}}  {'PSI':>6}  {'noise':>6}  {'sample':>7}  {'min':>5}  state")
    order = {DRIFT: 0, NO_DRIFT: 1, NOT_ENOUGH_DATA: 2}
    for name, f in sorted(features.items(), key=lambda kv: (order[kv[1]["state"]], -(kv[1].get("psi") or 0), kv[0])):
        psi, noise = f.get("psi"), f.get("noise_psi")
        lines.append(f"{name:<{width}}  {'n/a' if psi is None else f'{psi:.3f}':>6}  "
                     f"{'n/a' if noise is None else f'{noise:.3f}':>6}  {f['sample']:>7}  {f['min_sample']:>5}  "
                     f"{f['state'].upper() if f['state'] == DRIFT else f['state']}")
        if f["state"] == DRIFT:
            for moved in f["top_bins"]:
                lines.append(f"{'':<{width}}    {moved['bin']}: {moved['reference_share']:.1%} -> "
                             f"{moved['live_share']:.1%}")
    return "\n".join(lines)
