"""skill2triton command-line tools: legacy model, conversion, parity, serving, publishing."""
