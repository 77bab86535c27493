"""The judge: a reference and its float64 copy, the candidate's worker and what is watched in its process, and the
stages run in order by the driver (construct and parity, escape and own kernel, timing and ceilings, observation)."""
