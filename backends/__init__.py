"""Pure logic that Triton's python models run, plus the Python-based backends; no Triton import here."""
