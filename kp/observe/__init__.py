"""Where the time goes: PyTorch profiler tables, Nsight Compute counters, the verdict tables and the roofline
picture."""
