"""The search for a faster verified kernel: the loop that proposes and evaluates concurrently (loop), who proposes what
(proposing, tuner, elites, examples, facts, flatten, reflect), how a new best is crowned (duel), where candidates are
evaluated (executors on this machine, ray_executor across a cluster), a run's settings and records (prepare, runs),
and running many tasks on a few GPUs (lanes). `python -m agent.search.turns TASK` shows what one request costs."""
