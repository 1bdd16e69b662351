"""The search: which layouts to try, on which backend, and what was found.

`driver.run_search` is the entry point; `tune_glue` is the thin Ray Tune / Optuna adapter; `backends` is the
registry of backends by name; `results` holds the trial records, the Pareto front and the ranking.
(The package is `tuning`, not `search`, so that `autotune.search(...)`, the API function, is never shadowed.)
"""
