"""OpenAI's `/v1/chat/completions` and `/v1/completions` requests as `llm` generation requests (Triton's
generate_stream body), and `llm`'s answers in OpenAI's shapes. Pure: JSON in, dicts out; s2t/serve/openai_server.py
does the HTTP.

Every check names the parameter, as OpenAI's own errors do (`{"error": {"message", "type", "param", "code"}}`).
A chat is given to `llm` as one prompt: a lone user message as it is (the model's chat template wraps it), a longer
conversation as its turns, one per line, each led by its role.
"""
from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass, field

ROLES = ("system", "user", "assistant", "developer")
# OpenAI takes at most 4 stop sequences.
MAX_STOP = 4
MAX_BODY_BYTES = 64 * 1024
FINISH_REASONS = {"stop": "stop", "length": "length"}


class OpenAIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def invalid(param: str, reason: str) -> OpenAIError:
    return OpenAIError(400, f"{param}: {reason}", param)


@dataclass(frozen=True)
class OpenAIRequest:
    chat: bool
    model: str
    prompt: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:24])
    created: int = field(default_factory=lambda: int(time.time()))

    def triton_body(self) -> dict:
        """The generate_stream body for `llm`: always streamed, so a client that leaves stops the generation."""
        body = {"text_input": self.prompt, "stream": True}
        for name, value in (("max_tokens", self.max_tokens), ("temperature", self.temperature),
                            ("top_p", self.top_p), ("seed", self.seed)):
            if value is not None:
                body[name] = value
        if self.stop:
            body["stop_words"] = list(self.stop)
        return body

    @property
    def object_id(self) -> str:
        return ("chatcmpl-" if self.chat else "cmpl-") + self.id

    def _envelope(self, chunk: bool) -> dict:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.chat else "text_completion"
        return {"id": self.object_id, "object": kind, "created": self.created, "model": self.model}

    def chunk(self, text: str, finish_reason: str | None = None) -> dict:
        """One streamed piece: a token's text, or (with finish_reason) the last, empty piece."""
        if self.chat:
            delta = {"content": text} if text or finish_reason is None else {}
            choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None}
        return {**self._envelope(chunk=True), "choices": [choice]}

    def token_event(self, text: str) -> bytes:
        """`data: <chunk(text)>` and its blank line, as server-sent event bytes: the same JSON as json.dumps of
        `chunk(text)`, its envelope serialised once per stream rather than once per token."""
        parts = self.__dict__.get("_token_event_parts")
        if parts is None:
            marker = "\u0000token\u0000"
            whole = json.dumps(self.chunk(marker))
            head, tail = whole.split(json.dumps(marker), 1)
            parts = self.__dict__["_token_event_parts"] = (b"data: " + head.encode(), tail.encode() + b"\n\n")
        return parts[0] + json.dumps(text).encode() + parts[1]

    def usage_chunk(self, usage: dict) -> dict:
        return {**self._envelope(chunk=True), "choices": [], "usage": usage}

    def whole(self, text: str, finish_reason: str, usage: dict) -> dict:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None}
        return {**self._envelope(chunk=False), "choices": [choice], "usage": usage}


def usage(final: dict) -> dict:
    """OpenAI's usage from `llm`'s final response (input_tokens, output_tokens)."""
    prompt, completion = int(final.get("input_tokens", 0)), int(final.get("output_tokens", 0))
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def finish_reason(final: dict) -> str:
    return FINISH_REASONS.get(str(final.get("finish_reason")), "stop")


def _number(body: dict, name: str, kind, low, high):
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise invalid(name, f"expected a number, got {type(value).__name__}")
    if not math.isfinite(value) or not low <= value <= high:
        raise invalid(name, f"must be between {low} and {high}, got {value}")
    if kind is int and value != int(value):
        raise invalid(name, f"expected an integer, got {value}")
    return kind(value)


def _content(index: int, message) -> tuple[str, str]:
    if not isinstance(message, dict):
        raise invalid(f"messages[{index}]", "expected an object with role and content")
    role, content = message.get("role"), message.get("content")
    if role not in ROLES:
        raise invalid(f"messages[{index}].role", f"expected one of {', '.join(ROLES)}, got {role!r}")
    if isinstance(content, list):
        # Content parts: only text parts are understood by a text model.
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise invalid(f"messages[{index}].content", "only text parts are supported")
            texts.append(part["text"])
        content = "".join(texts)
    if not isinstance(content, str):
        raise invalid(f"messages[{index}].content", f"expected text, got {type(content).__name__}")
    return role, content


def chat_prompt(messages) -> str:
    if not isinstance(messages, list) or not messages:
        raise invalid("messages", "expected a non-empty list of messages")
    turns = [_content(i, m) for i, m in enumerate(messages)]
    if turns[-1][0] != "user":
        raise invalid(f"messages[{len(turns) - 1}].role", "the last message must be the user's")
    if len(turns) == 1:
        return turns[0][1]
    return "\n".join(f"{role}: {content}" for role, content in turns)


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise invalid("stop", "expected a string or a list of strings")
    if len(stops) > MAX_STOP:
        raise invalid("stop", f"at most {MAX_STOP} sequences, got {len(stops)}")
    return tuple(s for s in stops if s)


def parse_request(raw: bytes, chat: bool, models: tuple[str, ...]) -> OpenAIRequest:
    """The request, or OpenAIError naming the parameter (404 for a model that is not served)."""
    if len(raw) > MAX_BODY_BYTES:
        raise OpenAIError(413, f"the request body is over {MAX_BODY_BYTES} bytes")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as err:
        raise OpenAIError(400, f"the request body is not JSON ({err})") from None
    if not isinstance(body, dict):
        raise OpenAIError(400, "the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("model", "required")
    if model not in models:
        raise OpenAIError(404, f"The model `{model}` does not exist (served: {', '.join(models)})", "model",
                          code="model_not_found")
    if chat:
        prompt = chat_prompt(body.get("messages"))
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise invalid("prompt", "expected one string")
    if not prompt.strip():
        raise invalid("messages" if chat else "prompt", "empty prompt")
    _number(body, "n", int, 1, 1)  # one choice per request
    max_tokens = _number(body, "max_completion_tokens", int, 1, 1 << 20)
    if max_tokens is None:
        max_tokens = _number(body, "max_tokens", int, 1, 1 << 20)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise invalid("stream", "expected true or false")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
        raise invalid("stream_options", "expected an object like {\"include_usage\": true}")
    return OpenAIRequest(chat=chat, model=model, prompt=prompt, max_tokens=max_tokens,
                         temperature=_number(body, "temperature", float, 0.0, 2.0),
                         top_p=_number(body, "top_p", float, 0.0, 1.0),
                         seed=_number(body, "seed", int, -1, 2**31 - 1), stop=_stop(body), stream=stream,
                         include_usage=bool(options.get("include_usage", False)))


def upstream_error(status: int, message: str) -> OpenAIError:
    """`llm`'s refusal in OpenAI's terms: a full queue is a rate limit (the SDK retries it), a bad value the
    caller's, anything else the server's."""
    if "admission queue is full" in message:
        return OpenAIError(429, message, kind="rate_limit_error", code="queue_full")
    if 400 <= status < 500:
        field_name = message.split(":", 1)[0] if ":" in message else None
        return OpenAIError(400, message, field_name)
    return OpenAIError(502 if status >= 500 else status, message, kind="server_error")


def triton_error_text(status: int, body: bytes) -> str:
    """What Triton said when it refused a call: the `error` of its JSON body, plain or as an event (`data: {...}`,
    how generate_stream refuses), else a plain status line (a proxy's or a crashed server's body is no message for
    the caller)."""
    for line in body.splitlines() or [b""]:
        line = line.strip()
        if line.startswith(b"data:"):
            line = line[5:]
        try:
            error = json.loads(line).get("error")
        except (ValueError, AttributeError):
            continue
        if error:
            return str(error)
    return f"HTTP {status} from Triton"

