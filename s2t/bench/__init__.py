"""`s2t bench`: Triton side by side with the architectures a migration would otherwise pick, in one run."""
