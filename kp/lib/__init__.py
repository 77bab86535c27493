"""The library models/ import (through harness.py): the kernel registry, what a source exports, the build and its
content-hash cache, the CPU-side compile checks, the layers models are made of, numerics and the timer."""
