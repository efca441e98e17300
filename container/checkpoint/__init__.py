"""Checkpoints: DCP save/load with a verified manifest (dcp, manifest), Hugging Face export
(hf_export) and pretrained weights (pretrained)."""
