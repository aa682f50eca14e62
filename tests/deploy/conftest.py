from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items):
    """The deployment files (compose, Kubernetes, KServe) checked as their tools resolve them, and their commands run
    here where this machine can: `-m "not deploy"` skips them."""
    for item in items:
        if Path(item.path).resolve().is_relative_to(HERE):
            item.add_marker(pytest.mark.deploy)
