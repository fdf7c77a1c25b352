"""The dataset (seed section 3 and the export): the best root-to-leaf paths of each tree, SFT JSONL and its card."""
