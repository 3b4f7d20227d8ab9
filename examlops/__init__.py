"""examlops: serve scikit-learn models by MLflow alias, record, watch drift, retrain."""

__version__ = "0.1.0"
