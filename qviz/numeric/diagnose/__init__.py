"""Why a layer loses accuracy: findings by cause, their rules, evidence and measured remedies.

:func:`diagnose` (:mod:`~qviz.numeric.diagnose.diagnose`) turns a report into findings;
:mod:`~qviz.numeric.diagnose.rules` holds the causes and the rules that name them,
:mod:`~qviz.numeric.diagnose.gain` measures what each remedy is worth on its layer and
:mod:`~qviz.numeric.diagnose.choice` prescribes the best that pays.

Example:
    >>> from qviz.numeric.diagnose import Cause, diagnose
    >>> callable(diagnose), Cause.CLIPPING.value
    (True, 'clipping')
"""

# last, after every submodule has loaded: the name ``diagnose`` is the function, not the module
from qviz.numeric.diagnose.diagnose import Diagnosis, Finding, diagnose
from qviz.numeric.diagnose.gain import RemedyEstimate
from qviz.numeric.diagnose.rules import Cause, Prescription

__all__ = ["Cause", "Diagnosis", "Finding", "Prescription", "RemedyEstimate", "diagnose"]
