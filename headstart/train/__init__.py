"""Training draft heads on a frozen target: data collation, pure loss functions, one accelerate loop."""
