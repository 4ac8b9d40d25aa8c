"""The teacher-forced passes of validation and evaluation, outside autograd: through the decoder's fused decoding step
(``fused_decoders.step_through``, what ``decoder(...)`` runs there since it was measured faster) against the pass
it replaced (``decoder.step`` by step, or a hand-written recurrence where ``takes_fast_path``; a rearranged loop
stays where it was, and both columns time it); and the counterfactual replays, one per mode as evaluation runs them
(``CounterfactualReplay``: the fused step with the swap) against the copies of the decoder stepped with a
``CounterfactualAttention`` they replaced. Every registered scorer × cell × decoder convention whose recurrence
reads the attention (Bahdanau, Luong with input feeding) and that has a fused step; a seeded untrained model (emb
64 / hidden 128) on copy-task batches of 128 (lengths 1–30), one thread, the passes alternating, medians of the
repeats.

    python benchmarks/teacher_forcing_speed.py            # ≈ 2 min on 2 cores
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from cases import DECODERS

from attnseq.attention import SCORERS
from attnseq.data import Seq2SeqData, collate, encode_examples
from attnseq.errors import ConfigError
from attnseq.faithfulness.counterfactual import MODES, CounterfactualReplay, counterfactual_decoder
from attnseq.model import ModelConfig, build_seq2seq
from attnseq.model.fused_decoders import step_through

CELLS = ("gru", "lstm")
BATCH = 128


@dataclass
class Row:
    case: str  # cell/scorer/decoder
    before: str  # what the replaced pass ran: "step", "fused recurrence" or "rearranged loop"
    now: str  # what ``decoder(...)`` runs now: "decoding step", or the same as before
    seconds: dict[str, float]  # "pass before", "pass now", "replay before", "replay now": medians over the batches

    def ratio(self, what: str) -> float:
        return self.seconds[f"{what} before"] / self.seconds[f"{what} now"]


def decoder_options(case: str) -> dict:
    """``ModelConfig`` keywords of a decoder variant of ``cases.DECODERS`` (``decoder=luong``,
    ``decoder.input_feeding=true`` → ``decoder="luong", input_feeding=True``)."""
    options = {}
    for override in DECODERS[case]:
        key, value = override.split("=", 1)
        group, _, field = key.partition(".")
        options[field or group] = json.loads(value) if field else value
    return options


def batches(size: int, seed: int = 0):
    """``size`` copy-task pairs of lengths 1–30, length-sorted, in batches of ``BATCH``, and the vocabularies."""
    data = Seq2SeqData(task="copy", train_lengths=[1, 30], eval_lengths=[1, 30], bucket_width=5,
                             train_size=size, val_size=8, test_size=8, batch_size=BATCH, num_symbols=10, seed=seed)
    data.setup()
    examples = sorted(data.train_examples, key=lambda example: len(example.src))
    tensors = encode_examples(examples, data.src_vocab, data.tgt_vocab)
    return [collate(tensors[start : start + BATCH]) for start in range(0, len(tensors), BATCH)], data


def timed(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


@torch.inference_mode()
def measure_case(model, batched, repeats: int) -> dict[str, float]:
    """Seconds over all batches of each of the four passes, alternating, medians of ``repeats``."""
    decoder = model.decoder
    encoded = [model.encode(batch.src, batch.src_lengths) for batch in batched]  # (memory, state) each

    def before_pass() -> None:
        for batch, (memory, state) in zip(batched, encoded):
            if decoder.takes_fast_path():
                decoder.teacher_forced(batch.tgt_in, state, memory)
            else:
                step_through(lambda tokens, now, memory=memory: decoder.step(tokens, now, memory), batch.tgt_in, state)

    def now_pass() -> None:
        for batch, (memory, state) in zip(batched, encoded):
            decoder(batch.tgt_in, state, memory)

    twins = [counterfactual_decoder(decoder, mode, torch.Generator().manual_seed(1)) for mode in MODES]
    replays = [CounterfactualReplay(decoder, mode, torch.Generator().manual_seed(1)) for mode in MODES]

    def before_replay() -> None:
        for batch, (memory, state) in zip(batched, encoded):
            for twin in twins:
                twin(batch.tgt_in, state, memory)

    def now_replay() -> None:
        for batch, (memory, state) in zip(batched, encoded):
            for replay in replays:
                replay(batch.tgt_in, state, memory)

    passes = {"pass before": before_pass, "pass now": now_pass, "replay before": before_replay,
              "replay now": now_replay}
    seconds: dict[str, list[float]] = {name: [] for name in passes}
    for _ in range(repeats):
        for name, run in passes.items():
            seconds[name].append(timed(run))
    return {name: statistics.median(values) for name, values in seconds.items()}


def measure(size: int = 1000, repeats: int = 5, scorers: list[str] | None = None, log=print) -> list[Row]:
    batched, data = batches(size)
    rows = []
    for cell, scorer, case in itertools.product(CELLS, scorers or list(SCORERS), DECODERS):
        torch.manual_seed(0)
        config = ModelConfig(len(data.src_vocab), len(data.tgt_vocab), embedding_dim=64, hidden_size=128, cell=cell,
                             scorer=scorer, **decoder_options(case))
        try:
            config.validate()
        except ConfigError:
            continue  # a combination the model config refuses
        model = build_seq2seq(config).eval()
        decoder = model.decoder
        if not getattr(decoder, "attention_feeds_recurrence", lambda: False)():
            continue  # its teacher-forced pass did not change
        with torch.inference_mode():
            memory, _ = model.encode(batched[0].src, batched[0].src_lengths)
            if decoder.fused_decoding(memory) is None:
                continue  # no fused step: both passes are the ones before
            now = decoder.decodes_teacher_forcing(memory)
        # what ran before: the step, a hand-written recurrence (which moved) or the rearranged loop (which stays)
        before = "step" if not decoder.takes_fast_path() else "fused recurrence" if now else "rearranged loop"
        row = Row(f"{cell}/{scorer}/{case}", before, "decoding step" if now else before,
                  measure_case(model, batched, repeats))
        log(f"  {row.case}: pass {row.ratio('pass'):.2f}×, replay {row.ratio('replay'):.2f}×")
        rows.append(row)
    return rows


def pass_speedups(rows: list[Row]) -> list[float]:
    """The pass's speed-up in each case the change moved to the decoding step."""
    return [row.ratio("pass") for row in rows if row.now != row.before]


def render(rows: list[Row], size: int, repeats: int, threads: int) -> str:
    lines = [
        "## Teacher forcing outside autograd: validation's and evaluation's passes",
        "",
        f"A seeded untrained model (emb 64 / hidden 128) on {size:,} copy-task targets (lengths 1–30) in batches of "
        f"{BATCH}, {threads} thread(s), in inference mode; seconds over all batches, medians of {repeats}, the four "
        "passes alternating. `pass`: `decoder(tgt_in, …)`, now the fused decoding step over the target where the "
        "pass was `decoder.step` by step or a hand-written recurrence, against what it ran before (where a "
        "rearranged loop stays, both columns time that one path: no speed-up is given); `replay`: the "
        "counterfactual replays, one per mode (permute, uniform) as evaluation runs them (`CounterfactualReplay`: "
        "the fused step with the swap; uniform's fixed weights leave the scores out) against copies of the decoder "
        "with a `CounterfactualAttention`, stepped.",
        "",
        "| case | pass before | pass now | pass before (s) | pass now (s) | pass speed-up | replay before (s) "
        "| replay now (s) | replay speed-up |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        s = row.seconds
        speedup = f"**{row.ratio('pass'):.2f}×**" if row.now != row.before else "(the same path)"
        lines.append(f"| {row.case} | {row.before} | {row.now} | {s['pass before']:.3f} | {s['pass now']:.3f} "
                     f"| {speedup} | {s['replay before']:.3f} | {s['replay now']:.3f} "
                     f"| **{row.ratio('replay'):.2f}×** |")
    passes, replays = pass_speedups(rows), [row.ratio("replay") for row in rows]
    if passes:
        lines += ["", f"The pass: median {statistics.median(passes):.2f}× (range {min(passes):.2f}–{max(passes):.2f}×) "
                      f"over the {len(passes)} cases it moved."]
    if replays:
        lines += ["", f"The replays: median {statistics.median(replays):.2f}× (range {min(replays):.2f}–"
                      f"{max(replays):.2f}×) over all {len(rows)}."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=1000, help="target sequences")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--scorers", nargs="*", choices=list(SCORERS), help="default: every registered scorer")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = measure(args.size, args.repeats, args.scorers)
    print(render(rows, args.size, args.repeats, args.threads))


if __name__ == "__main__":
    main()
