"""Cross-layer equalization (Nagel et al. 2019)."""


def cross_layer_equalization(gm, **kwargs):
    raise NotImplementedError
