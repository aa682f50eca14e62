"""Integration tests: s2t/control/ against the live server: publish, rollouts, canaries, status, control modes."""
