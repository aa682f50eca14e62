"""The reference legacy service's model: Keras on German Credit, preprocessing inside the graph, a TF SavedModel."""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from s2t.atomic_files import durable_rename
from s2t.models import dataset

SEED = 20261129
HOLDOUT_FRACTION = 0.2
EPOCHS = 40
BATCH_SIZE = 32


@dataclass(frozen=True)
class TrainingReport:
    rows_train: int
    rows_holdout: int
    holdout_auc: float
    logistic_regression_auc: float
    beats_baseline: bool
    saved_model: str


def split(n: int) -> tuple[np.ndarray, np.ndarray]:
    """A fixed stratification-free shuffle split: the same rows every time for the same seed."""
    order = np.random.default_rng(SEED).permutation(n)
    cut = int(round(n * (1 - HOLDOUT_FRACTION)))
    return np.sort(order[:cut]), np.sort(order[cut:])


def _keras_inputs(data: dataset.Dataset):
    import tensorflow as tf

    return {name: tf.constant(col.reshape(-1, 1).astype(str if name in data.categorical else np.float32))
            for name, col in data.columns.items()}


def _build(train: dataset.Dataset, lite: bool = False):
    """`lite`: the linear part alone, a logistic regression with the same preprocessing: the fallback scorer."""
    import keras

    inputs, encoded = {}, []
    for name, col in train.categorical.items():
        inputs[name] = keras.Input(shape=(1,), dtype="string", name=name)
        # Vocabulary from training rows only: an unseen category takes the OOV slot, as in production.
        lookup = keras.layers.StringLookup(vocabulary=sorted(set(col.tolist())), num_oov_indices=1,
                                           output_mode="one_hot", name=f"{name}_lookup")
        encoded.append(lookup(inputs[name]))
    for name, col in train.numeric.items():
        inputs[name] = keras.Input(shape=(1,), dtype="float32", name=name)
        norm = keras.layers.Normalization(axis=None, name=f"{name}_norm")
        norm.adapt(col.reshape(-1, 1))
        encoded.append(norm(inputs[name]))
    features = keras.layers.Concatenate(name="features")(encoded)
    reg = keras.regularizers.l2(1e-2)
    # Wide & deep: the linear part alone is a logistic regression; the hidden layer adds interactions.
    logit = keras.layers.Dense(1, kernel_regularizer=reg, name="wide")(features)
    if not lite:
        hidden = keras.layers.Dense(16, activation="relu", kernel_regularizer=reg, name="hidden")(features)
        hidden = keras.layers.Dropout(0.3, seed=SEED, name="dropout")(hidden)
        deep = keras.layers.Dense(1, kernel_regularizer=reg, name="deep")(hidden)
        logit = keras.layers.Add(name="logit")([logit, deep])
    probability = keras.layers.Activation("sigmoid", name="probability")(logit)
    model = keras.Model(inputs=inputs, outputs=probability, name="risk_model_lite" if lite else "risk_model")
    model.compile(optimizer=keras.optimizers.Adam(learning_rate=1e-3), loss="binary_crossentropy")
    return model


def _logistic_regression_auc(train: dataset.Dataset, holdout: dataset.Dataset) -> float:
    from sklearn.compose import ColumnTransformer
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    def table(d: dataset.Dataset) -> np.ndarray:
        return np.column_stack([d.categorical[n] for n in d.categorical] + [d.numeric[n] for n in d.numeric])

    n_cat = len(train.categorical)
    prep = ColumnTransformer([
        ("categorical", OneHotEncoder(handle_unknown="ignore"), list(range(n_cat))),
        ("numeric", StandardScaler(), list(range(n_cat, n_cat + len(train.numeric)))),
    ])
    baseline = make_pipeline(prep, LogisticRegression(max_iter=2000))
    baseline.fit(table(train), train.is_bad)
    return float(roc_auc_score(holdout.is_bad, baseline.predict_proba(table(holdout))[:, 1]))


def build(csv_path: Path, out_dir: Path, lite: bool = False) -> TrainingReport:
    """Train deterministically and export the SavedModel (signature serving_default) to out_dir."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf
    from sklearn.metrics import roc_auc_score

    keras.utils.set_random_seed(SEED)
    tf.config.experimental.enable_op_determinism()
    data = dataset.load(csv_path)
    train_rows, holdout_rows = split(len(data))
    train, holdout = data.take(train_rows), data.take(holdout_rows)

    model = _build(train, lite)
    model.fit(_keras_inputs(train), train.is_bad.astype(np.float32).reshape(-1, 1),
              epochs=EPOCHS, batch_size=BATCH_SIZE, shuffle=True, verbose=0)
    auc = float(roc_auc_score(holdout.is_bad, model.predict(_keras_inputs(holdout), verbose=0).ravel()))
    baseline_auc = _logistic_regression_auc(train, holdout)

    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = out_dir.with_name(out_dir.name + ".partial")
    if staging.exists():
        shutil.rmtree(staging)
    model.export(str(staging), format="tf_saved_model", verbose=False)
    report = TrainingReport(len(train), len(holdout), auc, baseline_auc, auc > baseline_auc, str(out_dir))
    (staging / "training_report.json").write_text(json.dumps(asdict(report), indent=2) + "\n")
    if out_dir.exists():
        shutil.rmtree(out_dir)
    durable_rename(staging, out_dir)
    return report
