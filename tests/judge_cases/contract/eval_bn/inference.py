"""The same model judged with --mode eval (inference semantics): accepted."""
from eval_in_init import ModelNew  # noqa: F401  (the candidate's own folder is importable)

EXPECT = None
DEVICES = ("cpu", "cuda")
FLAGS = ("--allow-torch", "--mode", "eval")
