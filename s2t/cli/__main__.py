"""`python -m s2t.cli`: the GPU venv (.venv-gpu) has no s2t script of its own."""
from s2t.cli import main

main()
