"""Draft heads (Medusa, EAGLE-1/2, EAGLE-3) and their Hugging Face checkpoints."""
