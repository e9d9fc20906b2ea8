"""MLflow runs -> validation curves -> sigmoid fits (ScaleRL Eq. 1) -> ranked reports.

Works from MLflow data and metric names alone: never imports torch or the trainer (ablate.tracking, stdlib only, is
the one piece of `ablate` it uses). mlflow, matplotlib and scipy are imported inside the functions that need them,
so `import analysis` stays fast.
"""

from analysis.fit import fit_runs, fit_sigmoid
from analysis.law import FitError, SigmoidFit
from analysis.report import Report, make_report

__all__ = ["FitError", "SigmoidFit", "fit_runs", "fit_sigmoid", "make_report", "Report"]
