"""skill2triton command-line tools: legacy model, conversion, parity, serving, publishing."""
import importlib.util as _util
import sys as _sys
from pathlib import Path as _Path

# backends/ and clients/ at the top of the repository are the packages s2t.backends and s2t.clients (setup.py's
# package_dir). An installed s2t (a wheel, a release's src/) holds them under s2t/. In a checkout (an editable install,
# or the checkout put on sys.path as it is: the compose stack's .pth file, locust's PYTHONPATH) this finder maps
# exactly those two names, first among the finders, so that a folder left under s2t/ by an older layout (a
# __pycache__ git does not remove) cannot shadow them. The same mapping: s2t/project_imports.py PACKAGE_DIRS.
_HERE = _Path(__file__).resolve().parent
_CHECKOUT_PACKAGES = {"s2t.backends": _HERE.parent / "backends", "s2t.clients": _HERE.parent / "clients"}


class _CheckoutPackages:
    @staticmethod
    def find_spec(name, path=None, target=None):
        folder = _CHECKOUT_PACKAGES.get(name)
        if folder is None:
            return None
        return _util.spec_from_file_location(name, folder / "__init__.py", submodule_search_locations=[str(folder)])


if (not (_HERE / "backends" / "__init__.py").is_file() and (_HERE.parent / "setup.py").is_file()
        and all((folder / "__init__.py").is_file() for folder in _CHECKOUT_PACKAGES.values())
        and not any(getattr(finder, "__name__", "") == _CheckoutPackages.__name__ for finder in _sys.meta_path)):
    _sys.meta_path.insert(0, _CheckoutPackages)
