"""Tensor2Tensor glue around the core: the registered T2TModels (`model`, Mesh-TF in `mtf/`),
what `t2t_usr_dir` installs (`glue`), TF 2.15 fixes (`compat`), checkpoint files and the
`hparams.json` check, reliability of training runs, perplexity arithmetic and `--t2t_usr_dir`
loading for our tools. Imports the core, never `tools`.
"""
