"""What Triton's `initialize(args)` says about a model (its config JSON parsed once) and its settings read from
the config's parameters: unknown keys reported, files resolved in the model's folders, the decoupled check."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from s2t.backends.runtime.model_parameters import (MODEL_FOLDER, VERSION_FOLDER, ParameterError, read_parameters,
                                                   unknown_parameters)


@dataclass(frozen=True)
class ModelArgs:
    """What Triton's `initialize(args)` says about the model, its config JSON parsed once."""

    config: dict
    name: str
    folder: Path
    version: str

    @classmethod
    def of(cls, args: Mapping[str, str]) -> "ModelArgs":
        return cls(json.loads(args["model_config"]), args["model_name"], Path(args["model_repository"]),
                   args["model_version"])

    @property
    def parameters(self) -> dict:
        return self.config.get("parameters", {})

    @property
    def version_dir(self) -> Path:
        return self.folder / self.version

    @property
    def repository(self) -> Path:
        """The model repository this model sits in (`model_repository` is the model's own folder)."""
        return self.folder.parent

    @property
    def folders(self) -> dict[str, Path]:
        """What the files a config names are relative to (backends/runtime/model_parameters.py `path_parameter`)."""
        return {MODEL_FOLDER: self.folder, VERSION_FOLDER: self.version_dir}

    def with_parameters(self, parameters: Mapping) -> "ModelArgs":
        """The same model with other parameters (a version's own settings over the config's)."""
        return dataclasses.replace(self, config={**self.config, "parameters": dict(parameters)})


class ModelSettings:
    """Glue's reading of a model's settings (it gives `pb` and `name`)."""

    def settings(self, cls: type, args: ModelArgs, error: type[ValueError] = ParameterError, strict: bool = True,
                 **given) -> Any:
        """`cls` read from the config's parameters, the files they name resolved in the model's folders; with
        `strict`, keys it does not read are logged (a typo there keeps a default silently; `s2t check-config`
        refuses them before a server starts)."""
        if strict:
            self.report_unknown(args, cls)
        return read_parameters(cls, args.parameters, error, args.folders, **given)

    def report_unknown(self, args: ModelArgs, *classes: type) -> list[str]:
        """Logs the keys none of `classes` reads (for a model whose parameters fill several settings types)."""
        unknown = sorted(set.intersection(*(set(unknown_parameters(cls, args.parameters)) for cls in classes)))
        if unknown:
            self.pb.Logger.log_warn(f"{self.name}: parameters {', '.join(unknown)} are not ones it reads")
        return unknown

    def require_decoupled(self, args: ModelArgs, why: str) -> None:
        if not self.pb.using_decoupled_model_transaction_policy(args.config):
            raise ValueError(f"{self.name} {why}: its config must set model_transaction_policy {{ decoupled: true }}")
