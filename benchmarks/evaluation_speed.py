"""Evaluation throughput: sequences per second of ``evaluate_run`` (greedy and beam 5, with the
counterfactual replays; no attention explorer, which the reference does not draw) against the loop it
replaced (``evaluation_reference``), in one process on the same model and examples, the loops
alternating so that a busy machine slows them alike; and decoding alone, through the decoder's fused
decoding step and through ``decoder.step`` (``stepwise``, as the reference decodes).

    python benchmarks/evaluation_speed.py --run-id <id> --tracking-uri sqlite:///mlflow.db
    python benchmarks/evaluation_speed.py            # a seeded untrained copy-task model instead
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import torch
from evaluation_reference import reference_evaluate_run

from attnseq.data import Seq2SeqDataModule, collate, encode_examples
from attnseq.evaluation.evaluator import EvalSettings, evaluate_run, evaluation_examples, length_limit
from attnseq.evaluation.trained_runs import TrainedRun
from attnseq.model import ModelConfig, build_seq2seq, greedy_decode
from attnseq.model.beam import beam_search

BEAM_SIZES = (1, 5)


@dataclass
class EvaluationSpeed:
    model: str
    sequences: int
    threads: int
    seconds: dict[str, dict[int, float]]  # "reference"/"batched" → beam size → best seconds of the repeats
    decoding_s: dict[int, float]  # beam size → best seconds of encoding + decoding alone, batched as evaluate_run does
    stepwise_s: dict[int, float]  # the same through decoder.step at each step, as the reference decodes

    def rate(self, loop: str, beam_size: int) -> float:
        return self.sequences / self.seconds[loop][beam_size]

    def ratio(self, beam_size: int) -> float:
        return self.seconds["reference"][beam_size] / self.seconds["batched"][beam_size]

    def bound(self, beam_size: int) -> float:
        """The most any batching of the rest could give: the reference's time over decoding's alone."""
        return self.seconds["reference"][beam_size] / self.decoding_s[beam_size]

    def decoding_ratio(self, beam_size: int) -> float:
        """Decoding alone through ``decoder.step`` over decoding alone through the fused step."""
        return self.stepwise_s[beam_size] / self.decoding_s[beam_size]


@torch.inference_mode()
def decode_only(trained: TrainedRun, settings: EvalSettings, examples: list, stepwise: bool = False) -> None:
    """What ``evaluate_run`` cannot batch away: each batch encoded and decoded (the tokens alone), in its
    order and sizes; ``stepwise``: through ``decoder.step``."""
    ordered = sorted(examples, key=lambda example: len(example.src))
    tensors = encode_examples(ordered, trained.src_vocab, trained.tgt_vocab)
    for start in range(0, len(tensors), settings.batch_size):
        batch = collate(tensors[start : start + settings.batch_size])
        limit, beam_size = length_limit(trained, batch), settings.beam_size
        if beam_size > 1:
            beam_search(trained.model, batch.src, batch.src_lengths, beam_size, limit, keep_attention=False,
                        stepwise=stepwise)
        else:
            greedy_decode(trained.model, batch.src, batch.src_lengths, limit, keep_attention=False, stepwise=stepwise)


def decode_stepwise(trained: TrainedRun, settings: EvalSettings, examples: list) -> None:
    decode_only(trained, settings, examples, stepwise=True)


def seeded_copy_run(seed: int = 0) -> TrainedRun:
    """An untrained GRU/additive/Bahdanau model (emb 64, hidden 128) on the copy task, lengths 1-15."""
    dataset = dict(task="copy", train_lengths=[1, 15], eval_lengths=[1, 30], bucket_width=5, train_size=64,
                   val_size=8, test_size=8, batch_size=64, num_symbols=10)
    data = Seq2SeqDataModule(**dataset, seed=seed)
    data.setup()
    torch.manual_seed(seed)
    model = build_seq2seq(ModelConfig(len(data.src_vocab), len(data.tgt_vocab), embedding_dim=64, hidden_size=128))
    config = {"dataset": dataset, "seed": seed, "decode": {"max_length_ratio": 1.5, "max_length_extra": 5}}
    return TrainedRun(None, config, data.src_vocab, data.tgt_vocab, model.eval())


def measure(trained: TrainedRun, size: int = 2000, repeats: int = 2, lengths: tuple[int, int] | None = None,
            log=print) -> EvaluationSpeed:
    """Best-of-``repeats`` seconds of each loop at each beam size, the loops alternating."""
    lengths = lengths or (1, 2 * trained.train_lengths[1])
    seconds: dict[str, dict[int, float]] = {"reference": {}, "batched": {}, "decoding": {}, "stepwise": {}}
    loops = {"reference": reference_evaluate_run, "batched": evaluate_run, "decoding": decode_only,
             "stepwise": decode_stepwise}
    for beam_size in BEAM_SIZES:
        settings = EvalSettings(lengths=lengths, bucket_width=int(trained.config["dataset"]["bucket_width"]),
                                size=size, beam_size=beam_size, counterfactual=True, seed=1, explorer_samples=0)
        examples = evaluation_examples(trained, settings)
        for _ in range(repeats):
            for name, loop in loops.items():
                start = time.perf_counter()
                loop(trained, settings, examples)
                elapsed = time.perf_counter() - start
                seconds[name][beam_size] = min(seconds[name].get(beam_size, float("inf")), elapsed)
                log(f"  {name:9s} beam {beam_size}: {elapsed:6.2f} s")
    name = trained.run.info.run_name if trained.run is not None else "seeded untrained gru/additive/bahdanau"
    decoding_s, stepwise_s = seconds.pop("decoding"), seconds.pop("stepwise")
    return EvaluationSpeed(name, size, torch.get_num_threads(), seconds, decoding_s, stepwise_s)


def render(speed: EvaluationSpeed) -> str:
    lines = [
        "## Evaluation throughput",
        "",
        f"`evaluate_run` on {speed.sequences} sequences of {speed.model}, with the counterfactual replays "
        f"(permute and uniform), {speed.threads} thread(s); the reference is the loop before batching "
        "(`benchmarks/evaluation_reference.py`, decoding through `decoder.step`), timed alternately in the same "
        "process (best of the repeats); no attention explorer (`eval.explorer_samples=0`: the reference draws none).",
        "",
        "| decoding | reference seq/s | batched seq/s | ratio | decoding alone seq/s | bound on the ratio "
        "| decoding alone, step by step, seq/s | fused decoding step |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for beam_size in BEAM_SIZES:
        label = "greedy" if beam_size == 1 else f"beam {beam_size}"
        alone = speed.sequences / speed.decoding_s[beam_size]
        stepwise = speed.sequences / speed.stepwise_s[beam_size]
        lines.append(f"| {label} | {speed.rate('reference', beam_size):.0f} | {speed.rate('batched', beam_size):.0f} "
                     f"| {speed.ratio(beam_size):.2f}× | {alone:.0f} | {speed.bound(beam_size):.2f}× | {stepwise:.0f} "
                     f"| {speed.decoding_ratio(beam_size):.2f}× |")
    lines += [
        "",
        "`decoding alone`: the same batches encoded and decoded (the tokens alone, as `evaluate_run` keeps them), "
        "nothing else — what `evaluate_run` must do whatever it batches; `bound`: the reference's time over that, "
        "the ratio a loop that made the teacher-forced pass, the metrics and both counterfactual replays free would "
        "reach; `step by step`: the same decoding through `decoder.step` (`stepwise=True`), and `fused decoding "
        "step` its time over decoding alone's.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-id", help="a trained run to evaluate (default: a seeded untrained model)")
    parser.add_argument("--tracking-uri", default="sqlite:///mlflow.db")
    parser.add_argument("--size", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.run_id:
        from attnseq.evaluation.trained_runs import get_run, load_trained_run
        from attnseq.tracking.client import TrackingClient

        client = TrackingClient(args.tracking_uri)
        trained = load_trained_run(client, get_run(client, args.run_id))
    else:
        trained = seeded_copy_run()
    print(render(measure(trained, size=args.size, repeats=args.repeats)))


if __name__ == "__main__":
    main()
