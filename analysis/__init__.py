"""MLflow runs -> validation curves -> sigmoid fits (ScaleRL Eq. 1) -> ranked reports.

Works from MLflow data and metric names alone: imports nothing of `ablate` (the jobs use analysis's rule, never the
other way) and never torch. mlflow, matplotlib and scipy are imported inside the functions that need them,
so `import analysis` stays fast.
"""

from analysis.fit import fit_runs, fit_sigmoid
from analysis.law import FitError, SigmoidFit
from analysis.report import Report, make_report

__all__ = ["FitError", "SigmoidFit", "fit_runs", "fit_sigmoid", "make_report", "Report"]
