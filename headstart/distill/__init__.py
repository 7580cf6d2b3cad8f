"""Self-distillation: the target's own replies to prompts, as resumable training shards."""
