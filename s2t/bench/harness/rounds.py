"""Figures of rounds taken in turns: each round's ratio of two sides, the median round and the worst round.

On a shared machine one round says more about the moment than about the servers; sides that take turns meet the same
moments round by round, so each round is compared within itself and the rounds are read together: the median round
is the headline, the worst round says how far the machine moved it. With an even number of rounds the median round is
the worse of the two middle ones: a figure a round really reached, never an average that flatters.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence, TypeVar

T = TypeVar("T")
R = TypeVar("R")
Round = Mapping[str, float] | None  # one side's figures of one round; None: the side has no such round


def _known(value: float | None) -> bool:
    return value is not None and not math.isnan(value)


def _ratio(a: float | None, b: float | None) -> float:
    return a / b if _known(a) and _known(b) and b else float("nan")


@dataclass(frozen=True)
class Spread:
    """One figure over rounds (or starts, or swaps), in the order taken. `median_at` and `worst_at` are the indexes of
    the median and worst rounds (None when no round has the figure); `missing` counts the rounds without it."""

    values: tuple[float, ...]
    median: float
    worst: float
    median_at: int | None
    worst_at: int | None
    missing: int


def spread(values: Sequence[float | None], higher_is_better: bool) -> Spread:
    values = tuple(float("nan") if v is None else float(v) for v in values)
    # Worst first; among equal figures the earlier round comes first.
    ranked = sorted((i for i, v in enumerate(values) if _known(v)),
                    key=lambda i: values[i] if higher_is_better else -values[i])
    missing = len(values) - len(ranked)
    if not ranked:
        return Spread(values, float("nan"), float("nan"), None, None, missing)
    median_at, worst_at = ranked[(len(ranked) - 1) // 2], ranked[0]
    return Spread(values, values[median_at], values[worst_at], median_at, worst_at, missing)


@dataclass(frozen=True)
class Duel:
    """One side against its opponents, round by round. In each round the opponent is the one with the highest rate
    in that round (None: no opponent measured it); its p99 and CPU per request are the ones compared."""

    opponents: tuple[str | None, ...]
    rate: Spread  # ours / the opponent's rate
    p99: Spread  # ours / the opponent's p99
    cpu: Spread  # ours / the opponent's CPU per request
    p99_above: int  # rounds where our p99 was above the opponent's
    p99_unknown: int  # rounds where either p99 is missing

    @property
    def rounds(self) -> int:
        return len(self.opponents)

    @property
    def p99_at_or_below_every_round(self) -> bool:
        return self.rounds > 0 and self.p99_above == 0 and self.p99_unknown == 0


def _figure(entry: Round, key: str | None) -> float:
    value = entry.get(key) if entry is not None and key is not None else None
    return float(value) if _known(value) else float("nan")


def _at(rounds: Sequence[Round], number: int) -> Round:
    return rounds[number] if number < len(rounds) else None


def duel(ours: Sequence[Round], theirs: Mapping[str, Sequence[Round]], rate: str, p99: str = "p99_ms",
         cpu: str | None = None) -> Duel:
    """`ours` and each of `theirs` hold one entry per round, in the order taken; `rate`, `p99` and `cpu` name the
    figures in an entry (no `cpu`: not compared)."""
    opponents, rates, p99s, cpus, above, unknown = [], [], [], [], 0, 0
    for number, entry in enumerate(ours):
        measured = {name: _figure(_at(rounds, number), rate) for name, rounds in theirs.items()}
        measured = {name: value for name, value in measured.items() if _known(value)}
        # max keeps the first of equal rates: the order of `theirs` settles a tie.
        opponent = max(measured, key=measured.get, default=None)
        other = _at(theirs[opponent], number) if opponent is not None else None
        opponents.append(opponent)
        rates.append(_ratio(_figure(entry, rate), _figure(other, rate)))
        mine, theirs_p99 = _figure(entry, p99), _figure(other, p99)
        p99s.append(_ratio(mine, theirs_p99))
        if not (_known(mine) and _known(theirs_p99)):
            unknown += 1
        elif mine > theirs_p99:
            above += 1
        cpus.append(_ratio(_figure(entry, cpu), _figure(other, cpu)))
    return Duel(tuple(opponents), spread(rates, higher_is_better=True), spread(p99s, higher_is_better=False),
                spread(cpus, higher_is_better=False), above, unknown)


def take_turns(sides: Sequence[T], rounds: int, measure: Callable[[T, int], R]) -> dict[T, list[R]]:
    """`measure(side, round)` for every side in each of `rounds` rounds; each side's results in the order taken.

    The order rotates: round n starts with the side after the one that started round n-1, so no side is always the
    first after a pause (warmer caches, a machine that has just settled) or always the last."""
    taken: dict[T, list[R]] = {side: [] for side in sides}
    for number in range(rounds):
        shift = number % len(sides) if sides else 0
        for side in (*sides[shift:], *sides[:shift]):
            taken[side].append(measure(side, number))
    return taken


def median(values: Sequence[float | None], higher_is_better: bool = True) -> float:
    """The median as every bench figure takes it (`spread`): with an even count, the worse middle value."""
    return spread(values, higher_is_better).median


def median_round(entries: Sequence[Mapping], key: str, higher_is_better: bool = True) -> dict:
    """The round whose `key` is the median, whole (its other figures belong to the same round), with its number
    (from 1) under `round`."""
    at = spread([e.get(key) for e in entries], higher_is_better).median_at
    if at is None:
        return {**entries[0], "round": 1} if entries else {}
    return {**entries[at], "round": at + 1}
