"""What the teaching notebooks' prose may say: the numbers a Markdown cell states
(``prose_numbers``), those every machine agrees on (``_DEFINED``, ``PROSE_NUMBERS``) and those a
code cell writes (``_code_numbers``), for tests/test_notebooks.py's
``test_prose_states_no_measured_number``."""

from __future__ import annotations

import re

import nbformat

# ---- what the prose may say ---------------------------------------------------------------------
# A notebook runs on every torch version and CPU; its Markdown is fixed text. So a number the
# prose states is either one no machine changes (a definition, an integer range, a count fixed by
# the model, the data or the notebook's own code), or a cell prints it: "the table above", never
# "29.87 dB". The test finds every number in the Markdown (not in LaTeX, code blocks or the
# stated time, which test_stated_time_says_how_it_was_measured checks) and accepts it when a code
# cell of the notebook writes it (a constant the notebook sets), when it is one of _DEFINED, or
# when PROSE_NUMBERS declares it for that notebook, with why it holds on every machine. A number
# with a unit of measurement (dB, %, ×, s, KiB, ...) must always be declared: code that writes
# `100 *` does not make a "100%" in the prose a fact. The few measured claims the prose keeps are
# checked against the outputs on every run (CLAIMS).

_FENCE = re.compile(r"```.*?```", re.S)
_LATEX = re.compile(r"\$\$.*?\$\$|\$[^$\n]+\$", re.S)
_TIME = re.compile(r"\*Time:.*?\*", re.S)
_NUMBER = re.compile(r"(?<![\w.])(?:\d{1,3}(?:,\d{3})+|[-−]?\d+(?:\.\d+)?)(?!x\w)(?![^\Wx])")
_UNIT = re.compile(r"\s?(dB|%|×|x(?![\w-])|s(?!\w)|ms(?!\w)|KiB|MB|GBOP|GB(?!\w))")
_REFERENCE = re.compile(  # "notebook 04", "sections 2 and 3", "Nagel et al. 2019": not claims
    r"(?:notebooks?|Notebooks?|sections?|Sections?|Exercise|Scenario|et al\.|opset|Python|torch"
    r"|onnxruntime|JupyterLab|ipywidgets|Graphviz|step|steps|Step)\s*(?:\d+\s*(?:,|and|or)\s*)*$"
)
#: Numbers of the integer grids and bit widths every notebook uses.
_DEFINED = frozenset(
    {"0", "1", "2", "3", "4", "7", "8", "16", "32", "127", "-127", "128", "-128", "255", "256"}
)
_DB = {
    "0 dB": "the definition: the error as strong as the signal",
    "6 dB": "one bit: 20·log10(2), the definition of a halved error",
    "10": "the 10 of 10·log10, the definition of a dB",
}
_IMAGES = {
    "360": "the test split's size (qviz.data.digits_loaders)",
    "0.28 %": "one test image of 360: arithmetic",
}
#: Per notebook (its stem): the numbers its Markdown states that no code cell writes and
#: _DEFINED does not hold, each with why it is the same on every machine.
PROSE_NUMBERS: dict[str, dict[str, str]] = {
    "01_tensor_quantization": {
        "6 dB": _DB["6 dB"],
        "20": "the 20 of 20·log10, the dB of an amplitude ratio",
        "288": "block.conv1's weights per output channel: 32 × 3 × 3",
        "2048": "HistogramCalibrator's bins (num_bins' default)",
        "99.99 %": "the percentile method's default",
        "0.01 %": "the share it drops: 100 - 99.99",
    },
    "02_pt2e_post_training_quantization": {
        "180": "the calibration split's size (qviz.data.digits_loaders)",
        "52": "180 = 64 + 64 + 52: the last calibration batch",
        "40": "360 = 5 × 64 + 40: the last test batch",
        "14": "the prepared digits model's observers and groups (checked: CLAIMS and "
        "_check_prepared_counts)",
        "11": "a plan group's number, and the quantize ops of the counts table (checked: CLAIMS)",
        "6": "the dequantize_per_channel ops: the model's six weights (checked: CLAIMS)",
        "4 x": "int8 against float32: 1 byte a value against 4; qviz.viz.ranges' red: past 4x "
        "the median",
        "6 dB": _DB["6 dB"],
        **_IMAGES,
    },
    "03_writing_a_quantizer": {
        "0.0039": "1/256, the fixed scale: arithmetic",
        "0.003906": "the same",
    },
    "04_debugging_numerics": {
        **{k: _DB[k] for k in ("0 dB", "6 dB")},
        "12": "the 12 of 1/√12, the RMS of an error spread evenly over one step",
        "0.29": "1/√12: arithmetic",
        "10 dB": "a band edge of qviz.display.bands.SQNR",
        "40 dB": "a band edge of qviz.display.bands.SQNR",
        "36863": "64·64·3·3 − 1: conv2.0's weights but the planted one",
        "63": "64 − 1: conv2.0's output channels but channel 0",
    },
    "05_interactive_quantization": {
        **_DB,
        "50 dB": "the dashboard's fixed colour scale (qviz.widgets.dashboard.view)",
        "18 dB": "10·log10(64): arithmetic",
        "180": "the calibration split's size (qviz.data.digits_loaders)",
        "0.01 %": "the percentile method's default, 99.99",
        "1 %": "one image in 180: arithmetic",
    },
    "06_backend_config": {"6 dB": _DB["6 dB"], "0.000244": "2**-12: arithmetic"},
    "07_quantized_modules_and_onnx": {
        "0.01 %": "the share the percentile method drops: 100 - 99.99",
        **_IMAGES,
        "6 dB": _DB["6 dB"],
        "40 dB": "an error of 1 % of the logits: 20·log10(100), arithmetic",
        "1 %": "the same",
        "15": "the 4-bit narrow grid's levels, -7..7",
        "-7": "its lowest integer",
        "18": "127 / 7: arithmetic",
        "30": "the epochs the embedded checkpoint trained (qviz.data.train)",
    },
    "08_quantization_aware_training": {"0.28 %": _IMAGES["0.28 %"]},
    "09_lowering": {"512": "AVX-512, the name of a CPU feature"},
    "10_repair": {
        "10 ×": "the literature's range of channel spreads in trained networks (Nagel et al.)",
        "100 ×": "the same",
        "25 dB": "diagnose()'s default threshold_db",
        "0 dB": "the definition: the error as strong as the signal",
    },
    "11_mixed_precision": {"4096": "4**6 assignments: arithmetic", **_IMAGES},
}


def prose_numbers(markdown: str) -> list[str]:
    """The numbers a Markdown cell states, as ``"48"`` or, with a unit, ``"48 ×"``.

    >>> prose_numbers("about 48x the median; see notebook 04, section 2; int8 [-128, 127]")
    ['48 x', '-128', '127']
    """
    text = _TIME.sub(" ", _LATEX.sub(" ", _FENCE.sub(" ", markdown)))
    found = []
    for line in text.splitlines():
        line = re.sub(r"^\s*#+\s*\d+(\.\d+)?", "", line)  # a heading's section number
        line = re.sub(r"^\s*\d+\.\s", "", line)  # a numbered list's marker
        for m in _NUMBER.finditer(line):
            if _REFERENCE.search(line[: m.start()]):
                continue
            number = _canonical(m.group(0))
            unit = _UNIT.match(line, m.end())
            found.append(f"{number} {unit.group(1)}" if unit else number)
    return found


def _canonical(number: str) -> str:
    """``"30.0"`` and ``"30"`` are one number; ``"36,863"`` is ``"36863"``."""
    number = number.replace("−", "-").replace(",", "")
    value = float(number)
    return str(int(value)) if value.is_integer() and abs(value) < 1e15 else number


def _code_numbers(nb: nbformat.NotebookNode) -> set[str]:
    code = " ".join(c.source for c in nb.cells if c.cell_type == "code")
    return {_canonical(m.group(0)).lstrip("-") for m in _NUMBER.finditer(code)}
