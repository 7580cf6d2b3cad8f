"""Self-distillation: the target's own replies to prompts, as resumable training shards.

Public API for training code:
    load_distilled(path) -> datasets.Dataset   columns: index, source_id, messages, input_ids, loss_mask,
                                               turns_finished, turns_exact, reply_tokens, settings, fingerprint
                                               (+ features_file with --cache-features)
    read_meta(path) -> dict                    fingerprint, settings, feature_layers (names or None)
    load_features(path, record) -> dict        'layer<i>' / 'last' -> (T, H) tensor of one record
    run_distill(cfg) -> summary dict           what `headstart distill` runs
"""

from headstart.distill.config import DatafreeConfig, DistillConfig
from headstart.distill.store import load_distilled, load_features, read_meta


def run_distill(*args: object, **kwargs: object) -> dict:
    """See headstart.distill.pipeline.run_distill (imported lazily: it pulls in torch)."""
    from headstart.distill.pipeline import run_distill as run

    return run(*args, **kwargs)  # type: ignore[arg-type]


__all__ = ["DatafreeConfig", "DistillConfig", "load_distilled", "load_features", "read_meta", "run_distill"]
