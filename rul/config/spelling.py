"""Did-you-mean hints for a misspelt key, also from the names other tools use for ours."""

import difflib

# Names other tools use for our keys, so a hint can point from them (or their typos) to ours.
ALIASES = {"learning_rate": "lr", "batch_size": "micro_batch_size", "num_epochs": "epochs",
           "n_epochs": "epochs", "grad_accumulation": "accumulation_steps",
           "clip_grad_norm": "max_grad_norm", "grad_clip": "max_grad_norm",
           "window_size": "window", "sequence_length": "window", "amp": "precision"}


def _did_you_mean(key: str, known) -> str:
    known = list(known)
    names = known + [alias for alias, target in ALIASES.items() if target in known]
    close = difflib.get_close_matches(key, names, n=1)
    return f" (did you mean {ALIASES.get(close[0], close[0])!r}?)" if close else ""
