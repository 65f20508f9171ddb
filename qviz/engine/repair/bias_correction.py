"""Empirical bias correction (Nagel et al. 2019, section 4.2)."""


def bias_correction(converted, float_gm, data, **kwargs):
    raise NotImplementedError
