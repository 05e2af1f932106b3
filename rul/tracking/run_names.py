"""A run's names: its config digest (the identity `--resume` looks for) and its default name."""

import hashlib
import json

CONFIG_DIGEST_TAG = "rul.config_digest"


def config_digest(config) -> str:
    """Same identity -> same digest (what `--resume` looks for)."""
    return hashlib.sha256(json.dumps(config.identity(), sort_keys=True).encode()
                          ).hexdigest()[:16]


def default_run_name(config, world_size: int = 1) -> str:
    """What ran, at a glance: e.g. cnn-b512-k2-s42 (b: the global effective batch)."""
    return (f"{config.model}-b{config.effective_batch_size * world_size}"
            f"-k{config.accumulation_steps}-s{config.seed}")
