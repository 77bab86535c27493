"""The kernel playground's machinery behind harness.py (what models/ import) and run.py (the judge)."""
