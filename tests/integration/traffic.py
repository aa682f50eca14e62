"""Constant traffic beside what a test changes or attacks: each caller pauses PACE_S between two requests (about 500
a second each), so that traffic runs through every change without taking the cores that the commands under test,
the servers and the tests on the other worker run on. A caller's loop: `while not stop.wait(PACE_S): ...`."""
PACE_S = 0.002
