"""Integration tests: the language model served: admission, streams, rollouts, the OpenAI API."""
