"""The built-in head kinds, registered by name (SpecForge's builtin.py): the one place that names
where each kind's head, drafter and objective live. `import headstart` runs it, so the registry
(headstart/kinds.py) knows them before anything asks; the references are strings, imported when a
kind is first used, so this costs no import of torch. The import-graph test reads each reference
as an edge from here: this module sits above every kind's files, the registry below them all.
A new kind: its files, and one line here (docs/developer/add-a-head-kind.md)."""

from headstart.kinds import DraftKind, HeadKind, register, register_draft

register(HeadKind("medusa", {"fc": "headstart.heads.medusa:MedusaHeads"}, "headstart.inference.drafters.medusa:MedusaDrafter", "headstart.train.objectives.medusa:medusa_loss", "Medusa-1 (per-head CE)", ("medusa", "headstart"), metric_step="head", trees="static", joint_lora=True, free_on_init=("draft_vocab_size",), head_section="headstart.heads.medusa:MedusaOptions", loss_section="headstart.train.objectives.medusa:MedusaLoss"))  # fmt: skip
register(HeadKind("eagle", {"fc": "headstart.heads.eagle:EagleHead"}, "headstart.inference.drafters.eagle:EagleDrafter", "headstart.train.objectives.eagle:eagle1_loss", "EAGLE-1 (SmoothL1 features + CE)", head_section="headstart.heads.eagle:EagleOptions", loss_section="headstart.train.objectives.eagle:EagleLoss"))  # fmt: skip
register(HeadKind("eagle3", {"fc": "headstart.heads.eagle:Eagle3FcHead", "reference": "headstart.heads.eagle:Eagle3Head"}, "headstart.inference.drafters.eagle:EagleDrafter", "headstart.train.objectives.eagle:eagle3_loss", "EAGLE-3 training-time test ({cfg.loss.ttt_steps} steps)", ("speculators", "eagle", "headstart"), reads_layers=True, taps=(3, 3), head_section="headstart.heads.eagle:Eagle3Options", loss_section="headstart.train.objectives.eagle:Eagle3Loss"))  # fmt: skip
register(HeadKind("dflash", {"fc": "headstart.heads.dflash:DFlashHead"}, "headstart.inference.drafters.dflash:DFlashDrafter", "headstart.train.objectives.dflash:dflash_loss", "DFlash blocks of {cfg.head.block_size} ({cfg.loss.dflash_anchors} anchors a conversation, {cfg.loss.dflash_labels} CE, slot decay)", ("speculators", "dflash", "headstart"), reads_layers=True, taps=(1, None), trees="block", head_section="headstart.heads.dflash:DFlashOptions", loss_section="headstart.train.objectives.dflash:DFlashLoss"))  # fmt: skip
register(HeadKind("draft_model", {"fc": "headstart.heads.draft:DraftLM"}, "headstart.inference.drafters.draft_model:DraftModelDrafter", "headstart.train.objectives.draft:draft_loss", "KL to the target's next-token distribution (a draft model: the target's first {cfg.head.num_layers} layers, unless head.draft_from={cfg.head.draft_from})", ("headstart", "transformers"), metric_step="step", trees="dynamic", head_section="headstart.heads.draft:DraftOptions"))  # fmt: skip

# drafters with nothing to train, named by --draft-model (a model path or Hub id is none of them)
register_draft(DraftKind("lookahead", "headstart.inference.drafters.lookahead:load", "headstart.inference.drafters.lookahead:tune_candidates", "headstart.inference.drafters.lookahead:default_spec", "lookahead", own_tree=True, check="headstart.inference.trees.lookahead:parse_lookahead"))  # fmt: skip
register_draft(DraftKind("early-exit", "headstart.drafts:load_early_exit", "headstart.drafts:exit_candidates", "headstart.drafts:default_exit", "early_exit"))  # fmt: skip
