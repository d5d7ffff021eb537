"""The model itself, free of Tensor2Tensor: attention as pure functions (`attention/`), online
k-means (`kmeans`), the layers and head dispatch (`layers`, `heads`), the memory switches
(`memory`), cached decoding and samplers (`decoding`, `sampling`), the non-finite guard
(`health`), the cost model (`cost`) and the Keras layers (`keras`).
"""
