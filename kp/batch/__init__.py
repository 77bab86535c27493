"""Many jobs: what a job, a job file and a results file are, and the local slots and Ray tasks that judge them."""
