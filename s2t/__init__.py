"""skill2triton command-line tools: legacy model, conversion, parity, serving, publishing."""
from pathlib import Path as _Path

# backends/ and clients/ at the top of the repository are the packages s2t.backends and s2t.clients. An install maps
# them (setup.py's package_dir; the editable install's import finder). A checkout put on sys.path as it is, with no
# install (the compose stack's containers: its .pth file, locust's PYTHONPATH), finds them here, beside s2t/. An
# installed s2t holds its own backends/, and nothing is added.
_CHECKOUT = _Path(__file__).resolve().parent.parent
if (_CHECKOUT / "backends" / "__init__.py").is_file() and not (_CHECKOUT / "s2t" / "backends").exists():
    __path__.append(str(_CHECKOUT))
