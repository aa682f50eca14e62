"""The measurements beyond the side-by-side run: CPU per request, HTTP against gRPC, the heavier scorers' crossover, the cutover, the GPU engines, the language model, a stub's profile."""
