"""Tensor2Tensor glue around the core: the registered T2TModels (`model`, Mesh-TF in `mtf/`),
every patch of T2T/TF (`patches`, applied by `patches.install()`) and its helpers (`glue`),
checkpoint files and the `hparams.json` check, reliability of training runs, perplexity
arithmetic and `--t2t_usr_dir` loading for our tools. Imports the core, never `tools`.
"""
