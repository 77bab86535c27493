"""The candidate's worker: the process a candidate's ModelNew runs in (or, for the playground's own variants, the
judge's process), its loop and commands, its calls with their backward pass, its measuring, what it watches in the
candidate's process, the kernel languages it sees compiled, and how it answers. The judge's side (kp.judge) talks
to it through kp.judge.runners."""
