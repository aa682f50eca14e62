"""Gates: parity row by row, config checks, canary analysis, drift, what an image must install."""
