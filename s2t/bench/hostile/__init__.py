"""`s2t soak --hostile`: the run (runner), its hostile clients (floods) and its verdicts (report)."""
