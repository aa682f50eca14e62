"""A clock the test moves by hand (`clock.now += 1.5`): the code under test takes it wherever it reads the time."""


class Clock:
    def __init__(self, now: float = 100.0):
        self.now = now

    def __call__(self) -> float:
        return self.now
