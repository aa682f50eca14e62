"""Which legacy calls the gateway serves: a bounded pool of call slots that idle or greedy callers cannot hold.

A slot is held from a call's admission to its end. Four rules keep the pool fair:
- a caller (one connection) holds at most `per_caller` slots; its next call is refused at once;
- a call that sends no record for `idle_timeout_s` is ended, and no call lasts longer than `call_timeout_s`;
- when every slot is taken, a new call takes the slot of the call that has been silent the longest, provided it has
  been silent for at least `reclaim_after_s`: a silent call holds a slot only while nobody else needs it;
- otherwise the new call is refused at once, told how long until a slot can free up.
A call whose caller has sent all its records is being scored: it is working, never reclaimed for silence.

Pure logic: the clock is given, nothing here waits. The gateway asks `admit` on each new call, reports each record
(`heard`) and the end of the records (`closed`), ends the calls `overdue` names, and `release`s every slot it got.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from s2t.gateway.gateway_options import GatewayOptions

# Status names as gRPC spells them, without importing gRPC into pure logic.
RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
UNAVAILABLE = "UNAVAILABLE"
DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"


@dataclass(frozen=True)
class AdmissionLimits:
    slots: int = GatewayOptions.workers
    per_caller: int | None = GatewayOptions.max_calls_per_caller  # None: all of `slots`
    call_timeout_s: float = GatewayOptions.call_timeout_s
    idle_timeout_s: float = GatewayOptions.idle_timeout_s
    reclaim_after_s: float = 0.5

    def __post_init__(self):
        if self.per_caller is None:
            object.__setattr__(self, "per_caller", self.slots)
        if self.slots < 1 or not 1 <= self.per_caller <= self.slots:
            raise ValueError(f"need slots >= 1 and 1 <= per_caller <= slots, got {self}")
        if min(self.call_timeout_s, self.idle_timeout_s, self.reclaim_after_s) <= 0:
            raise ValueError(f"call timeouts must be positive, got {self}")


@dataclass(frozen=True)
class Ending:
    """Why a call ends (or is refused): the gRPC status name, the caller's message, and when to retry (seconds;
    None when retrying as is would not help)."""
    status: str
    message: str
    retry_after_s: float | None = None


@dataclass(eq=False)
class Ticket:
    """One admitted call. `ending` is set once the gateway must end it; `task` is the gateway's handle on it."""
    caller: str
    admitted_at: float
    heard_at: float
    receiving: bool = True
    ending: Ending | None = None
    task: object = field(default=None, repr=False)


@dataclass(frozen=True)
class Admission:
    ticket: Ticket | None = None
    reclaimed: Ticket | None = None  # the silent call that gave up its slot: the gateway ends it
    refused: Ending | None = None


class CallAdmission:
    def __init__(self, limits: AdmissionLimits, clock: Callable[[], float] = time.monotonic):
        self.limits = limits
        self.clock = clock
        self._held: dict[Ticket, None] = {}  # insertion-ordered set
        self._per_caller: dict[str, int] = {}

    @property
    def in_use(self) -> int:
        return len(self._held)

    def admit(self, caller: str) -> Admission:
        limits, now = self.limits, self.clock()
        # A share of every slot is no share: the pool's own rule (reclaim or refuse) applies instead.
        if limits.per_caller < limits.slots and self._per_caller.get(caller, 0) >= limits.per_caller:
            return Admission(refused=Ending(
                RESOURCE_EXHAUSTED, f"this connection already has {limits.per_caller} calls in progress, its share "
                                    f"of the gateway's {limits.slots} call slots; retry once one of them has ended"))
        reclaimed = None
        if len(self._held) >= limits.slots:
            silent = [t for t in self._held if t.receiving and t.ending is None]
            quietest = min(silent, key=lambda t: t.heard_at, default=None)
            if quietest is None or now - quietest.heard_at < limits.reclaim_after_s:
                wait = limits.reclaim_after_s - (now - quietest.heard_at) if quietest else limits.reclaim_after_s
                return Admission(refused=Ending(
                    RESOURCE_EXHAUSTED, f"all {limits.slots} call slots are busy with calls that are sending or "
                                        f"being scored; retry in {wait:.1f} s", retry_after_s=round(wait, 3)))
            reclaimed = quietest
            reclaimed.ending = Ending(
                UNAVAILABLE, f"ended after {now - quietest.heard_at:.1f} s without a record while every call slot "
                             f"was taken: another caller needed the slot; send a call's records without pauses, "
                             f"or retry", retry_after_s=0.0)
            self.release(reclaimed)
        ticket = Ticket(caller, now, now)
        self._held[ticket] = None
        self._per_caller[caller] = self._per_caller.get(caller, 0) + 1
        return Admission(ticket=ticket, reclaimed=reclaimed)

    def heard(self, ticket: Ticket) -> None:
        ticket.heard_at = self.clock()

    def closed(self, ticket: Ticket) -> None:
        ticket.receiving = False

    def release(self, ticket: Ticket) -> None:
        """The slot is free again; releasing twice is harmless (a reclaimed call releases when it ends too)."""
        if ticket in self._held:
            del self._held[ticket]
            left = self._per_caller[ticket.caller] - 1
            if left:
                self._per_caller[ticket.caller] = left
            else:
                del self._per_caller[ticket.caller]

    def overdue(self) -> list[Ticket]:
        """Calls past the call timeout, or silent past the idle timeout while sending; each gets its `ending` set
        (once) and must be ended by the gateway."""
        limits, now = self.limits, self.clock()
        due = []
        for ticket in self._held:
            if ticket.ending is not None:
                continue
            if now - ticket.admitted_at > limits.call_timeout_s:
                ticket.ending = Ending(DEADLINE_EXCEEDED, f"the call took longer than {limits.call_timeout_s:g} s "
                                                          f"(the gateway's limit)")
            elif ticket.receiving and now - ticket.heard_at > limits.idle_timeout_s:
                ticket.ending = Ending(DEADLINE_EXCEEDED, f"no record for {limits.idle_timeout_s:g} s (the "
                                                          f"gateway's idle limit); send a call's records without "
                                                          f"pauses", retry_after_s=0.0)
            else:
                continue
            due.append(ticket)
        return due
