"""One training objective a head kind (headstart.kinds registers each by "module:function"):
`loss(objective, feats, batch, evaluate, joint) -> {"loss", "parts"[, "hits"]}`, where
`objective` is train/objective.py's Objective (the head, the recipe, the target's lm_head rows).
A function with `full_logits = True` reads the target's logits at every position; one with a
`planner(cfg)` has its batches' indices planned on the host by the collate (EAGLE-3)."""
