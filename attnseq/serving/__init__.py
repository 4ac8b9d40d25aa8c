"""Serving: a trained run's model as an MLflow model that turns source text into decoded text.

- ``predictor``: ``Translator``, the model with its vocabularies and decoding settings (no MLflow);
- ``pyfunc_model``: the code MLflow runs to load it ("models from code": nothing is pickled); logging
  it with a run (signature, input example, requirements) is MLflow traffic: ``attnseq.tracking.logged_model``.

It stands beside tracking: it uses the model, data and tracking layers, never training or evaluation.
"""
