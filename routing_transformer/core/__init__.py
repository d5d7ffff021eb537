"""The model itself, free of Tensor2Tensor: attention as pure functions (`attention/`), online
k-means (`kmeans`), the layers and head dispatch (`layers`, `heads`), cached decoding and
samplers (`decoding`, `sampling`), `recompute`, the non-finite guard (`health`), the cost model
(`cost`) and the Keras layers (`keras`). Imports nothing from `t2t`, `tools` or Tensor2Tensor.
"""
