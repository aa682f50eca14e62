"""Callers that attack the serving ports below the level of a record, for `s2t soak --hostile`, each a real client on
loopback, bounded in count and by the end of `during`, each beside valid requests of its own:

- the classification of a BYTES output (`decision` of risk_pipeline) over HTTP, gRPC and a gRPC stream: Triton
  2.51's front ends divide by the datatype's size for it (0 for BYTES) and the process dies unless it is refused;
- ModelStreamInfer streams of 1 to 30 messages, some damaged on the wire (s2t/gate/hostile_requests.py's damage:
  flipped bytes, truncation, lengths past the end, wire types protobuf refuses), some with one absurd part;
- ModelInfer messages whose varints are overlong (padded with continuation bytes, within and past 10 bytes);
- a greedy client holding ModelInfer calls whose message never comes and streams that never speak, while a
  second client's ServerReady, ServerLive and ModelInfer must go on being answered.

Each returns {"sent", "outcomes", "unanswered", "hostile": {"sent", "as_expected"}, "valid": {"sent",
"as_expected"}, "unexpected": [...]}: what a correct server must do with each request is decided here, from the
request alone, and report.py turns the counts into a verdict per flood.
"""
from __future__ import annotations

import asyncio
import http.client
import json
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from s2t.backends.runtime import bytes_tensor
from s2t.gate import hostile_requests
from s2t.soak.from_address import ELSEWHERE, FromAddress, is_loopback
from s2t.soak.hostile.floods import REQUEST_TIMEOUT_S
from s2t.soak.hostile.valid_paths import host_port
from s2t.wire.names import PAYLOAD

SERVICE = "/inference.GRPCInferenceService/"
INFER, STREAM = SERVICE + "ModelInfer", SERVICE + "ModelStreamInfer"
READY, LIVE = SERVICE + "ServerReady", SERVICE + "ServerLive"
MODEL = "risk_pipeline"
# The BYTES output of risk_pipeline and a class count: the request that killed Triton 2.51.
BYTES_OUTPUT, CLASS_COUNT = "decision", 5
# What a refused request comes back as, per way in. UNAVAILABLE is not among them: it is a server that could not
# take the call (full, or gone), never the answer to a caller's mistake.
REFUSED = frozenset({"HTTP 400", "INVALID_ARGUMENT"})
# How the edge ends a stream at a message it refuses: its status details name the message, and every message before
# it has been answered.
STREAM_REFUSAL = re.compile(r"message (\d+) of the stream: ")
FIRST_MESSAGE_REFUSED = "message 1 of the stream: "
STREAM_MESSAGES = (1, 30)
# A stream in every ABSURD_EVERY carries one message with an absurd part (a dimension or an element length no
# buffer can have).
ABSURD_EVERY = 3
OVERLONG_DAMAGE = ("overlong tag within 5 bytes", "overlong tag of 6 to 10 bytes", "overlong length within 5 bytes",
                   "overlong length of 6 to 10 bytes", "varint past 10 bytes", "nested overlong tag")
# The greedy client's connections (its calls spread over them) and how often the second client asks.
GREEDY_CHANNELS = 6
PROBE_EVERY_S = 0.1
PROBE_TIMEOUT_S = 5.0
UNEXPECTED_SHOWN = 5
NO_ANSWER = "no answer"


@dataclass(frozen=True)
class Attempt:
    """One request of a flood: `side` "hostile" or "valid", a label (coarse: what is counted), whether it came back
    as it must, and a detail shown for those that did not (what was sent, what the server said)."""
    side: str
    label: str
    as_expected: bool
    answered: bool = True
    detail: str = ""


def tally(attempts: Sequence[Attempt], not_sent: int = 0) -> dict:
    result = {"sent": len(attempts), "outcomes": dict(Counter(a.label for a in attempts)),
              "unanswered": sum(not a.answered for a in attempts),
              "unexpected": sorted({f"{a.label} ({a.detail})" if a.detail else a.label
                                    for a in attempts if not a.as_expected})[:UNEXPECTED_SHOWN]}
    for side in ("hostile", "valid"):
        mine = [a for a in attempts if a.side == side]
        result[side] = {"sent": len(mine), "as_expected": sum(a.as_expected for a in mine)}
    if not_sent:
        result["outcomes"]["not sent (flood time over)"] = not_sent
    return result


def _flood(count: int, callers: int, deadline: float, one: Callable[[int], Attempt | list[Attempt]]) -> dict:
    def guarded(k: int) -> list[Attempt] | None:
        if time.monotonic() > deadline:
            return None
        try:
            got = one(k)
        except Exception as err:  # noqa: BLE001 - a client that broke is that request's outcome
            return [Attempt("hostile", f"client failed: {type(err).__name__}: {str(err)[:80]}", False, False)]
        return got if isinstance(got, list) else [got]

    with ThreadPoolExecutor(callers) as pool:
        results = list(pool.map(guarded, range(count)))
    return tally([a for r in results if r for a in r], sum(r is None for r in results))


def infer_message(record: bytes, request_id: str = "", classify: bool = False):
    """A ModelInferRequest for risk_pipeline with `record` as its one payload; asking for the classification of
    its BYTES output when `classify`."""
    from tritonclient.grpc import service_pb2
    message = service_pb2.ModelInferRequest(model_name=MODEL, id=request_id)
    message.inputs.add(name=PAYLOAD, datatype="BYTES", shape=[1, 1])
    message.raw_input_contents.append(bytes_tensor.encode([record]))
    if classify:
        message.outputs.add(name=BYTES_OUTPUT).parameters["classification"].int64_param = CLASS_COUNT
    return message


def _record(records: Sequence[Mapping], k: int, prefix: str) -> bytes:
    return json.dumps({"request_id": f"{prefix}-{k}", "features": records[k % len(records)]}).encode()


class _RawChannels:
    """One channel per thread that sends and receives bytes as they are (no protobuf on our side), closed at the
    end."""

    def __init__(self, grpc_url: str):
        self.url, self._local, self._all, self._lock = grpc_url, threading.local(), [], threading.Lock()

    def get(self):
        import grpc
        if not hasattr(self._local, "channel"):
            self._local.channel = grpc.insecure_channel(self.url)
            with self._lock:
                self._all.append(self._local.channel)
        return self._local.channel

    def unary(self, method: str, data: bytes, timeout_s: float = REQUEST_TIMEOUT_S) -> tuple[str, str, bytes]:
        """(status name, details, the answer's bytes)."""
        import grpc
        call = self.get().unary_unary(method, request_serializer=None, response_deserializer=None)
        try:
            return "OK", "", call(data, timeout=timeout_s)
        except grpc.RpcError as err:
            return err.code().name, err.details() or "", b""

    def stream(self, messages: Sequence[bytes], timeout_s: float = REQUEST_TIMEOUT_S) -> tuple[str, str, list]:
        """(final status name, details, the responses as ModelStreamInferResponse) of a stream that sends
        `messages` and half-closes."""
        import grpc
        from tritonclient.grpc import service_pb2
        call = self.get().stream_stream(STREAM, request_serializer=None,
                                        response_deserializer=service_pb2.ModelStreamInferResponse.FromString)
        responses = []
        try:
            for response in call(iter(messages), timeout=timeout_s):
                responses.append(response)
        except grpc.RpcError as err:
            return err.code().name, err.details() or "", responses
        return "OK", "", responses

    def close(self) -> None:
        for channel in self._all:
            channel.close()


def _gave_up(status: str, details: str) -> bool:
    """Our own deadline passed: the server never answered."""
    return status == "DEADLINE_EXCEEDED" and details == "Deadline Exceeded"


# ---- the classification of a BYTES output

def bytes_classification(http_url: str, grpc_url: str, records: Sequence[Mapping], count: int, callers: int,
                         deadline: float) -> dict:
    """`count` requests taking turns: the classification of `decision` over HTTP JSON, over gRPC, and inside a
    gRPC stream (followed by a valid message on the same stream), and a valid gRPC request. Each classification
    must be refused (HTTP 400, INVALID_ARGUMENT, or the stream's error message) and everything valid answered."""
    channels = _RawChannels(grpc_url)

    def http_classify(k: int) -> Attempt:
        body = json.dumps({"inputs": [{"name": PAYLOAD, "shape": [1, 1], "datatype": "BYTES",
                                       "data": [_record(records, k, "soak-classify").decode()]}],
                           "outputs": [{"name": BYTES_OUTPUT, "parameters": {"classification": CLASS_COUNT}}]})
        connection = http.client.HTTPConnection(*host_port(http_url), timeout=REQUEST_TIMEOUT_S)
        try:
            connection.request("POST", f"/v2/models/{MODEL}/infer", body, {"Content-Type": "application/json"})
            status = f"HTTP {connection.getresponse().status}"
        except (OSError, http.client.HTTPException) as err:
            return Attempt("hostile", f"HTTP: {NO_ANSWER} ({type(err).__name__})", False, False)
        finally:
            connection.close()
        return Attempt("hostile", f"HTTP: {status}", status in REFUSED)

    def one(k: int) -> Attempt | list[Attempt]:
        way = k % 4
        if way == 0:
            return http_classify(k)
        record = _record(records, k, "soak-classify")
        if way == 1 or way == 3:
            status, details, _ = channels.unary(INFER, infer_message(record, classify=way == 1).SerializeToString())
            answered = not _gave_up(status, details)
            if way == 1:
                return Attempt("hostile", f"gRPC: {status}", status in REFUSED, answered)
            return Attempt("valid", f"valid gRPC: {status}", status == "OK", answered, details[:100])
        status, details, responses = channels.stream([infer_message(record, classify=True).SerializeToString(),
                                                      infer_message(record).SerializeToString()])
        answered = not _gave_up(status, details)
        # Refused in the stream (an error message for it, as Triton's own endpoint does) or the stream ended over
        # it, naming the message (as the edge does): either is a refusal. In the first the valid message after it
        # on the stream must be scored; in the second the stream's error is its answer, and a valid request after
        # the stream must be scored.
        in_stream = bool(responses) and bool(responses[0].error_message)
        ended_over_it = not responses and status in REFUSED and details.startswith(FIRST_MESSAGE_REFUSED)
        hostile = Attempt("hostile", f"stream: {'its error message' if in_stream else status}",
                          in_stream or ended_over_it, answered, details[:100])
        if not in_stream and ended_over_it:
            after_status, after_details, _ = channels.unary(INFER, infer_message(record).SerializeToString())
            return [hostile, Attempt("valid", f"valid after the stream it ended: {after_status}",
                                     after_status == "OK", not _gave_up(after_status, after_details),
                                     after_details[:100])]
        scored = len(responses) == 2 and not responses[1].error_message
        return [hostile, Attempt("valid", "valid after it on the stream: " + (
                    "answered" if scored else status if len(responses) < 2 else "error message"), scored, answered,
                    details[:100] if len(responses) < 2 else responses[1].error_message[:100])]

    try:
        return _flood(count, callers, deadline, one)
    finally:
        channels.close()


# ---- damaged streams

def _absurd(record: bytes, rng: random.Random) -> tuple[str, bytes]:
    """A message with one absurd part: a dimension no tensor can have, or a BYTES element longer than any buffer."""
    message = infer_message(record)
    if rng.random() < 0.5:
        dim = rng.choice(hostile_requests.HUGE_DIMS)
        del message.inputs[0].shape[:]
        message.inputs[0].shape.extend([1, dim] if dim >= 0 else [dim, 1])
        return f"dimension {dim}", message.SerializeToString()
    del message.raw_input_contents[:]
    message.raw_input_contents.append((0xFFFFFFFF).to_bytes(4, "little") + record)
    return "element of 4 GiB", message.SerializeToString()


# The ways a stream is damaged, taking turns: bytes damaged at random (the message may still parse), messages no
# protobuf reader takes, and one absurd part in messages that are otherwise valid.
STREAM_DAMAGE = ("byte damage", "unparseable messages", "one absurd part")
BYTE_DAMAGE = ("bit flips", "chunk edit", "truncated", "nested truncated")
# A message of a damaged stream is damaged with these odds.
DAMAGE_ODDS = 0.3


def damaged_stream(records: Sequence[Mapping], seed: int, k: int) -> tuple[list[bytes], bool, str]:
    """Stream `k` of `seed`: 1 to 30 risk_pipeline requests damaged in the way STREAM_DAMAGE[k % 3] names (at least
    one message each). Returns the messages, whether every one of them is sure to parse (protobuf's Python reader
    takes it and no reader refuses that kind of damage: then each must be answered), and what was done."""
    from google.protobuf.message import DecodeError
    from tritonclient.grpc import service_pb2
    rng = random.Random(seed * 1_000_003 + k)
    way = STREAM_DAMAGE[k % len(STREAM_DAMAGE)]
    size = rng.randint(*STREAM_MESSAGES)
    messages = [infer_message(_record(records, k * 31 + i, "soak-damaged")).SerializeToString() for i in range(size)]
    chosen = [i for i in range(size) if rng.random() < DAMAGE_ODDS] or [rng.randrange(size)]
    if way == "one absurd part":
        what, messages[chosen[0]] = _absurd(_record(records, k, "soak-absurd"), rng)
        return messages, True, f"{size} messages, {what} in message {chosen[0] + 1}"
    kinds = BYTE_DAMAGE if way == "byte damage" else tuple(
        name for name, _, must in hostile_requests.WIRE_DAMAGE if must == hostile_requests.REFUSE)
    for i in chosen:
        messages[i] = hostile_requests.damaged(messages[i], rng.choice(kinds), rng.randrange(2**32))
    sure = way == "byte damage"
    for data in messages:
        try:
            service_pb2.ModelInferRequest.FromString(data)
        except DecodeError:
            sure = False
    return messages, sure, f"{size} messages, {way} in {len(chosen)}"


def damaged_streams(grpc_url: str, records: Sequence[Mapping], count: int, callers: int, deadline: float,
                    seed: int = 0) -> dict:
    """`count` streams of `damaged_stream`, each sent whole and half-closed, with a valid unary request after each
    on the same connection. Where every message is sure to parse, each must be answered (risk_pipeline answers one
    response per request, an error for the absurd one) and the stream end OK, or the stream be ended
    INVALID_ARGUMENT naming the message refused with every message before it answered (the edge's rule);
    otherwise the stream must be ended with a refusal (a status other than OK, UNAVAILABLE or UNKNOWN) or every
    message answered: never dropped or left hanging. The valid request after it must be scored."""
    channels = _RawChannels(grpc_url)

    def one(k: int) -> list[Attempt]:
        messages, sure, what = damaged_stream(records, seed, k)
        status, details, responses = channels.stream(messages)
        answered = not _gave_up(status, details)
        way = STREAM_DAMAGE[k % len(STREAM_DAMAGE)]
        every = len(responses) == len(messages)
        # The edge ends a stream at a message it refuses (one that does not parse, or one it would refuse alone),
        # naming it, once every message before it is answered; Triton's own endpoint answers each message.
        refused_at = STREAM_REFUSAL.match(details) if status == "INVALID_ARGUMENT" else None
        ended_at_a_named_message = bool(refused_at) and len(responses) >= int(refused_at.group(1)) - 1
        if sure:
            right = answered and ((status == "OK" and every) or ended_at_a_named_message)
        else:
            right = answered and (status not in ("OK", "UNAVAILABLE", "UNKNOWN") or (status == "OK" and every))
        label = (f"{way}, {'all parse' if sure else 'not all parse'}: {status}, "
                 f"{'every message answered' if every else 'not every message answered'}")
        valid_status, valid_details, _ = channels.unary(
            INFER, infer_message(_record(records, k, "soak-after-damage")).SerializeToString())
        return [Attempt("hostile", label, right, answered,
                        f"{what}; {len(responses)} answered; {details[:100]}"),
                Attempt("valid", f"valid after it: {valid_status}", valid_status == "OK",
                        not _gave_up(valid_status, valid_details), valid_details[:100])]

    try:
        return _flood(count, callers, deadline, one)
    finally:
        channels.close()


# ---- overlong varints

def overlong_varint_request(records: Sequence[Mapping], seed: int, k: int) -> tuple[str, bytes, bytes, str]:
    """Request `k` of `seed`: (the damage's name, the damaged message, the message before it, what a server must
    do with it: hostile_requests.REFUSE, SAME (answer it as the plain message) or ANY (answer or refuse))."""
    rng = random.Random(seed * 1_000_003 + k)
    plain = infer_message(_record(records, k, "soak-overlong")).SerializeToString()
    name = OVERLONG_DAMAGE[k % len(OVERLONG_DAMAGE)]
    must = {n: must for n, _, must in hostile_requests.WIRE_DAMAGE}[name]
    return name, hostile_requests.damaged(plain, name, rng.randrange(2**32)), plain, must


def overlong_varints(grpc_url: str, records: Sequence[Mapping], count: int, callers: int, deadline: float,
                     seed: int = 0) -> dict:
    """`count` unary ModelInfer messages, each with one varint overlong in one of OVERLONG_DAMAGE's ways, every
    fourth a valid message instead. Past 10 bytes a varint is no varint: refused. Within 5 bytes every protobuf
    reader takes it: answered as the plain message. From 6 to 10 bytes readers differ: answered or refused, never
    a server failure, a dropped call or silence."""
    channels = _RawChannels(grpc_url)

    def one(k: int) -> Attempt:
        name, data, plain, must = overlong_varint_request(records, seed, k)
        if k % 4 == 3:
            status, details, _ = channels.unary(INFER, plain)
            return Attempt("valid", f"valid: {status}", status == "OK", not _gave_up(status, details), details[:100])
        status, details, _ = channels.unary(INFER, data)
        answered = not _gave_up(status, details)
        if must == hostile_requests.REFUSE:
            right = status not in ("OK", "UNAVAILABLE", "UNKNOWN") and answered
        elif must == hostile_requests.SAME:
            right = status == "OK"
        else:
            right = status in ("OK", "INVALID_ARGUMENT", "INTERNAL") and answered
        return Attempt("hostile", f"{name}: {status}", right, answered, details[:100])

    try:
        return _flood(count, callers, deadline, one)
    finally:
        channels.close()


# ---- the greedy client

async def _never(release: asyncio.Event):
    """A request iterator that sends nothing until released, and nothing then either."""
    await release.wait()
    for nothing in ():  # an async generator that yields nothing
        yield nothing


async def _hold(grpc_url: str, held_calls: int, silent_streams: int, hold_until: float) -> Counter:
    """Opens the calls, keeps them until `hold_until`, then cancels them; how each had ended by then."""
    import grpc
    channels = [grpc.aio.insecure_channel(grpc_url, options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range(GREEDY_CHANNELS)]
    release = asyncio.Event()
    calls = []
    for k in range(held_calls + silent_streams):
        channel = channels[k % len(channels)]
        if k < held_calls:
            calls.append(("held ModelInfer", channel.stream_unary(INFER, request_serializer=None,
                                                                   response_deserializer=None)(_never(release))))
        else:
            calls.append(("silent stream", channel.stream_stream(STREAM, request_serializer=None,
                                                                 response_deserializer=None)(_never(release))))
    await asyncio.sleep(max(0.0, hold_until - time.monotonic()))
    ended = Counter()
    for kind, call in calls:
        if call.done():
            code = await call.code()
            ended[f"{kind}: ended {code.name} while held"] += 1
        else:
            ended[f"{kind}: held to the end"] += 1
        call.cancel()
    release.set()
    for channel in channels:
        await channel.close()
    return ended


def greedy_client(grpc_url: str, records: Sequence[Mapping], held_calls: int, silent_streams: int,
                  hold_until: float) -> dict:
    """A client holding `held_calls` ModelInfer calls whose message never comes and `silent_streams` streams that
    never send, until `hold_until`; meanwhile a second client asks ServerReady, ServerLive and ModelInfer in turn
    every PROBE_EVERY_S, each of which must be answered (ready, live, scored) within PROBE_TIMEOUT_S."""
    from tritonclient.grpc import service_pb2
    held: dict = {}

    # The greedy client is another machine's: on a server on loopback it connects from an address of its own, as
    # it would from elsewhere, while every valid caller of the soak keeps 127.0.0.1 (a server shares its calls
    # out by the address they come from, and this machine's own callers may take all but the reserve).
    host, port = host_port(grpc_url)
    relay = FromAddress(ELSEWHERE, port, host) if is_loopback(host) else None
    held["from"] = ELSEWHERE if relay else "the soak's own address"

    def hold() -> None:
        try:
            held["ended"] = asyncio.run(_hold(relay.url if relay else grpc_url, held_calls, silent_streams,
                                              hold_until))
        except Exception as err:  # noqa: BLE001 - a greedy client that broke is reported as such
            held["ended"] = Counter({f"greedy client failed: {type(err).__name__}: {str(err)[:80]}": 1})

    holder = threading.Thread(target=hold, name="soak-greedy", daemon=True)
    holder.start()
    channels = _RawChannels(grpc_url)
    attempts, k = [], 0
    time.sleep(min(1.0, max(0.0, hold_until - time.monotonic())))  # the calls opened first
    try:
        while time.monotonic() < hold_until:
            way = k % 3
            if way == 0:
                status, details, data = channels.unary(READY, b"", PROBE_TIMEOUT_S)
                right = status == "OK" and service_pb2.ServerReadyResponse.FromString(data).ready
                label = f"ServerReady: {status}" + (" ready" if right else "")
            elif way == 1:
                status, details, data = channels.unary(LIVE, b"", PROBE_TIMEOUT_S)
                right = status == "OK" and service_pb2.ServerLiveResponse.FromString(data).live
                label = f"ServerLive: {status}" + (" live" if right else "")
            else:
                message = infer_message(_record(records, k, "soak-beside-greedy"))
                status, details, _ = channels.unary(INFER, message.SerializeToString(), PROBE_TIMEOUT_S)
                right = status == "OK"
                label = f"ModelInfer: {status}"
            attempts.append(Attempt("valid", label, right, status != "DEADLINE_EXCEEDED", details[:100]))
            k += 1
            time.sleep(PROBE_EVERY_S)
    finally:
        channels.close()
        holder.join(REQUEST_TIMEOUT_S)
        if relay:
            relay.close()
    result = tally(attempts)
    result["held"] = {"calls": held_calls, "silent_streams": silent_streams, "from": held["from"],
                      "ended": dict(held.get("ended", {"still holding after its time": 1}))}
    result["hostile"] = {"sent": held_calls + silent_streams, "as_expected": held_calls + silent_streams}
    return result
