"""The tracking layer: everything a process records about its work leaves through here.

Training, sweeps and evaluation stand on it; it imports neither of them.

- ``store``: the tracking URI's fail-fast check (which also creates a database store's schema,
  under a file lock for SQLite) and experiments;
- ``retry``: how long a call may retry a server that stopped answering (``mlflow.retry_budget_s``),
  and ``TrackingUnavailable`` after that;
- ``setup``: the Hydra callback that masks the files Hydra writes (the process's redaction and retry
  settings are the entry point's runtime's, ``attnseq.runtime``);
- ``client``: ``TrackingClient``, every call the other layers make to a store (the one ``MlflowClient``);
- ``run``: ``TrackedRun``, one MLflow run and the only way params, tags, metrics and artifacts
  reach it, so that rules such as redaction apply once to every run;
- ``logged_model``: a run's model logged as an MLflow model (``attnseq.serving`` is its code);
- ``tags`` and ``paths``: the name of every tag, kind of run and artifact, defined once;
- ``redaction``, ``params``, ``provenance``: what is masked (everywhere), how a config becomes params, which
  commit and runtime (threads, versions, device, deterministic algorithms) a run was made with;
- ``plots``: the figures runs carry.
"""
