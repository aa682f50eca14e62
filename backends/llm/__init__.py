"""The language models: the engine and its admission, requests, token streams, version routing, the OpenAI protocol,
and the explainer."""
