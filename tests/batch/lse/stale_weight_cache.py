"""tests/wrong/stale_weight_cache.py as one of the sixteen: the column sum of the weights taken once, at the first
call, and never again."""
from tests.wrong.stale_weight_cache import ModelNew  # noqa: F401

EXPECT = r"after an optimizer step.*stale weight cache"
