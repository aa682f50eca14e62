"""`s2t soak --hostile`: valid paths (valid_paths), hostile patterns (floods, patterns), what is watched (watch), the
run (runner) and the verdicts (report)."""
