"""`rul report`: the Results and Performance pages of the docs, generated from what was measured.

records     one result row (an evaluation over seeds) and how it is read from MLflow or from the
            committed record of earlier results
reproduce   the `rul evaluate` command that re-runs an evaluation, from its logged params
benches     the benches' JSON results (`python -m bench --json DIR`) and the committed record
pages       the Markdown of the two pages
figures     predicted-vs-true and per-engine RUL trajectories of a logged model
cli         the `rul report` command
"""
