"""`vitlab ablate`: a training recipe run over a grid of settings and seeds (plan.py), one run folder per cell and
seed, resumable and optionally in parallel processes (runner.py), summarised as tables, curves and a page
(results.py)."""
