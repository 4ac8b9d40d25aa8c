"""Is the attention an explanation? Jain & Wallace's checks on a trained model, torch only: the
counterfactual replays (permuted and uniform weights, ``counterfactual``), the importance of each
source token for a decoder step (gradient × input, integrated gradients, leave-one-out: ``importance``),
the adversarial attention search (``adversarial``) and the fixed-sample probe that validation and
evaluation run (``probe``). Their settings and statistics, torch-free, are ``attnseq.metrics.faithfulness``."""
